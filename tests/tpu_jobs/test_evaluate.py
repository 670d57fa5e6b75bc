"""The evaluator on checkpoints of the real policy, saved through the RCP hooks (no GRPO here).

The training loop is replaced by a deterministic perturbation of the initial weights: what is
under test is restore -> verify -> unscanned model -> 4 attempts -> summary, not learning.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rcpflow import gate, manifest, recipe
from rcpflow.layout import RunLayout
from rcpflow.mllog import parse
from rcpflow.passk import mean_pass_at_k
from rcpflow.summary import read_summary, summary_problems
from tpu_jobs import checkpoint as ck
from tpu_jobs import evaluate, task
from tpu_jobs.model import ModelConfig, apply_scanned, apply_unscanned, init_params, unscan_params
from tpu_jobs.rcp_hooks import RcpHooks

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
CFG = ModelConfig(d_model=32, num_heads=2, num_layers=2, d_ff=64)
GBS, MAX_STEPS, VAL_START = 32, 4, 3


def build_run(run_dir: str) -> dict[int, dict]:
    """Steps 1..4 through RcpHooks; checkpoints (and rows) for steps 3 and 4."""
    hp = recipe.hyperparameters("closed", GBS, MAX_STEPS)
    hooks = RcpHooks(
        run_dir, 0, hp, VAL_START,
        checkpoint_extra={evaluate.MODEL_CONFIG_KEY: dataclasses.asdict(CFG)},
    )  # fmt: skip
    params = init_params(CFG, jax.random.PRNGKey(0))
    saved = {}
    hooks.on_init_start()
    hooks.on_run_start()
    for step in range(1, MAX_STEPS + 1):
        params = jax.tree.map(lambda x, s=step: x * (1.0 + 0.01 * s), params)
        saved[step] = jax.tree.map(np.asarray, params)
        hooks.after_update(step, params, {"count": jnp.int32(step)})
    hooks.on_train_end()
    return saved


@pytest.fixture(scope="module")
def built_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[int, dict]]:
    run_dir = str(tmp_path_factory.mktemp("eval") / "run")
    return run_dir, build_run(run_dir)


def copy_run(src: str, dst: Path) -> str:
    import shutil

    shutil.copytree(src, dst)
    return str(dst)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpu_jobs.evaluate", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def test_restored_unscanned_model_equals_saved_scanned_model(built_run) -> None:
    run_dir, saved = built_run
    row = manifest.load(RunLayout(run_dir).manifest).row(4)
    params, meta = ck.restore_params(row.checkpoint_path, row.weights_fingerprint)
    assert evaluate.model_config(meta, "t") == CFG
    outer, layers = unscan_params(params, axis=CFG.param_scan_axis)
    for i, layer in enumerate(layers):
        for view, stacked, original in zip(
            jax.tree.leaves(layer),
            jax.tree.leaves(params["layers"]),
            jax.tree.leaves(saved[4]["layers"]),
            strict=True,
        ):
            assert np.shares_memory(view, stacked)
            np.testing.assert_array_equal(view, np.take(original, i, axis=CFG.param_scan_axis))
    tokens = jnp.asarray(task.eval_prompts()[:16])
    np.testing.assert_allclose(
        np.asarray(apply_unscanned(CFG, outer, layers, tokens)),
        np.asarray(apply_scanned(CFG, saved[4], tokens)),
        rtol=1e-5, atol=1e-5,
    )  # fmt: skip


def test_evaluate_step_writes_valid_summary_and_attempts_then_reuses(built_run, tmp_path) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    layout = RunLayout(run_dir)
    proc = cli("--run-dir", run_dir, "--step", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = manifest.load(layout.manifest).row(3)
    summary = read_summary(layout.summary(3))
    assert summary_problems(summary, row) == []
    assert summary.instances == 251 and summary.attempts_per_instance == 4
    assert summary.completed_attempts == 1004 and summary.fatal_error is None
    assert summary.eval_start_ms <= summary.eval_stop_ms
    assert summary.checkpoint_timestamp_ms == row.timestamp_ms
    records = [
        json.loads(line)
        for line in Path(layout.attempts_dir(3), evaluate.ATTEMPTS_FILE).read_text().splitlines()
    ]
    assert len(records) == 1004
    assert {(r["instance"], r["attempt"]) for r in records} == {
        (i, a) for i in range(251) for a in range(4)
    }
    for r in records:
        assert r["reward"] == task.reward(tuple(r["prompt"]), tuple(r["completion"]))
        assert r["status"] == ("resolved" if r["reward"] == 1.0 else "failed")
    resolved = [0] * 251
    for r in records:
        resolved[r["instance"]] += r["status"] == "resolved"
    assert summary.resolved_attempts == sum(resolved)
    assert summary.eval_accuracy == pytest.approx(mean_pass_at_k([(4, c) for c in resolved], 4))

    before = Path(layout.summary(3)).read_bytes()
    again = cli("--run-dir", run_dir, "--step", "3")
    assert again.returncode == 0
    assert "reusing valid summary" in again.stdout
    assert Path(layout.summary(3)).read_bytes() == before


def test_evaluation_is_deterministic(built_run, tmp_path) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    layout = RunLayout(run_dir)
    assert evaluate.main(["--run-dir", run_dir, "--step", "4"]) == 0
    first = Path(layout.attempts_dir(4), evaluate.ATTEMPTS_FILE).read_bytes()
    os.remove(layout.summary(4))
    assert evaluate.main(["--run-dir", run_dir, "--step", "4"]) == 0
    assert Path(layout.attempts_dir(4), evaluate.ATTEMPTS_FILE).read_bytes() == first


def test_fingerprint_mismatch_gives_fatal_summary_and_nonzero_exit(built_run, tmp_path) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    layout = RunLayout(run_dir)
    rows = {r.step: r for r in manifest.parse_rows(Path(layout.manifest).read_text(), "m")}
    # The row of step 4 claims step 3's weights: a mis-recorded or swapped checkpoint.
    manifest.upsert(
        layout.manifest,
        dataclasses.replace(rows[4], weights_fingerprint=rows[3].weights_fingerprint),
    )
    assert evaluate.main(["--run-dir", run_dir, "--step", "4"]) == evaluate.EXIT_FATAL
    summary = read_summary(layout.summary(4))
    assert summary.fatal_error is not None and "FingerprintMismatchError" in summary.fatal_error
    assert not summary.target_reached and not summary.complete
    assert gate.valid_summary(run_dir, manifest.load(layout.manifest).row(4)) is None
    assert not Path(layout.attempts_dir(4)).exists()  # no score was computed


def test_corrupted_weights_give_fatal_summary_then_a_fixed_checkpoint_is_re_evaluated(
    built_run, tmp_path
) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    layout = RunLayout(run_dir)
    row = manifest.load(layout.manifest).row(3)
    kernel = built_run[1][3]["lm_head"]["kernel"]
    needle = kernel.tobytes()[:64]
    data_files = [p for p in Path(row.checkpoint_path, "params").rglob("*") if p.is_file()]
    [target] = [p for p in data_files if needle in p.read_bytes()]
    pristine = target.read_bytes()
    corrupted = bytearray(pristine)
    corrupted[pristine.index(needle) + 5] ^= 0x10
    target.write_bytes(bytes(corrupted))
    proc = cli("--run-dir", run_dir, "--step", "3")
    assert proc.returncode == evaluate.EXIT_FATAL
    assert "FingerprintMismatchError" in proc.stderr
    assert read_summary(layout.summary(3)).fatal_error is not None
    # A fatal summary is not reused: once the checkpoint is sound again it is evaluated.
    target.write_bytes(pristine)
    assert evaluate.main(["--run-dir", run_dir, "--step", "3"]) == 0
    assert summary_problems(read_summary(layout.summary(3)), row) == []


def test_unknown_step_is_bad_input(built_run, tmp_path) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    assert evaluate.main(["--run-dir", run_dir, "--step", "9"]) == evaluate.EXIT_BAD_INPUT
    assert not Path(RunLayout(run_dir).eval_dir(9)).exists()


def test_standalone_with_rcp_logging_writes_eval_events(built_run, tmp_path) -> None:
    row = manifest.load(RunLayout(built_run[0]).manifest).row(4)
    out = tmp_path / "out"
    proc = cli("--checkpoint", row.checkpoint_path, "--output-dir", str(out), "--rcp-logging")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = read_summary(str(out / "summary.json"))
    assert summary.checkpoint_step == 4 and summary.samples_count == 4 * GBS
    assert summary.checkpoint_timestamp_ms == row.timestamp_ms
    assert summary_problems(summary, row) == []
    events = parse((out / "mllog" / "eval.out").read_text())
    assert [e.key for e in events] == ["eval_start", "tracked_stats", "eval_accuracy", "eval_stop"]
    accuracy = events[2]
    assert accuracy.value == summary.eval_accuracy
    assert accuracy.metadata["samples_count"] == 4 * GBS
    assert events[0].time_ms == summary.eval_start_ms and events[3].time_ms == summary.eval_stop_ms


def test_standalone_refuses_half_written_checkpoint(built_run, tmp_path) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    step_path = manifest.load(RunLayout(run_dir).manifest).row(4).checkpoint_path
    os.remove(os.path.join(step_path, ck.COMMIT_MARKER))
    out = tmp_path / "out"
    assert evaluate.main(["--checkpoint", step_path, "--output-dir", str(out)]) == 3
    assert "not a complete checkpoint" in read_summary(str(out / "summary.json")).fatal_error
