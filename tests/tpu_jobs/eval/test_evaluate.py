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

from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.records import evaluating, manifest
from rcpflow.records.mllog import parse
from rcpflow.records.passk import mean_pass_at_k
from rcpflow.records.summary import read_summary
from rcpflow.records.summary_checks import validity_problems
from rcpflow.verdict import gate
from tpu_jobs import task
from tpu_jobs.eval import cli as eval_cli
from tpu_jobs.eval import shards as es
from tpu_jobs.eval.orchestration import ATTEMPTS_FILE
from tpu_jobs.rcp.callbacks import RcpHooks
from tpu_jobs.rcp.checkpoint_format import COMMIT_MARKER
from tpu_jobs.rcp.checkpoint_restore import restore_params
from tpu_jobs.toy import evaluate
from tpu_jobs.toy.evaluate import model_config
from tpu_jobs.toy.model import (
    MODEL_CONFIG_KEY,
    ModelConfig,
    apply_scanned,
    apply_unscanned,
    init_params,
    unscan_params,
)

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[3]
CFG = ModelConfig(d_model=32, num_heads=2, num_layers=2, d_ff=64)
GBS, MAX_STEPS, VAL_START = 32, 4, 3


def build_run(run_dir: str) -> dict[int, dict]:
    """Steps 1..4 through RcpHooks; checkpoints (and rows) for steps 3 and 4."""
    hp = recipe.hyperparameters("closed", GBS, MAX_STEPS)
    hooks = RcpHooks(
        run_dir, 0, hp, VAL_START,
        checkpoint_extra={MODEL_CONFIG_KEY: dataclasses.asdict(CFG)},
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


def flip_a_bit_of_lm_head(saved_params, checkpoint_path: str) -> tuple[Path, bytes]:
    """Flip one bit inside the saved lm_head kernel's bytes (Orbax restores it without
    complaint); returns the data file and its pristine bytes, to undo the damage."""
    needle = saved_params["lm_head"]["kernel"].tobytes()[:64]
    data_files = [p for p in Path(checkpoint_path, "params").rglob("*") if p.is_file()]
    [target] = [p for p in data_files if needle in p.read_bytes()]
    pristine = target.read_bytes()
    corrupted = bytearray(pristine)
    corrupted[pristine.index(needle) + 5] ^= 0x10
    target.write_bytes(bytes(corrupted))
    return target, pristine


def test_restored_unscanned_model_equals_saved_scanned_model(built_run) -> None:
    run_dir, saved = built_run
    row = manifest.load(RunLayout(run_dir).manifest).row(4)
    params, meta = restore_params(row.checkpoint_path, row.weights_fingerprint)
    assert model_config(meta, "t") == CFG
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
    assert validity_problems(summary, row) == []
    assert summary.instances == 251 and summary.attempts_per_instance == 4
    assert summary.completed_attempts == 1004 and summary.fatal_error is None
    assert summary.eval_start_ms <= summary.eval_stop_ms
    assert summary.checkpoint_timestamp_ms == row.timestamp_ms
    records = [
        json.loads(line)
        for line in Path(layout.attempts_dir(3), ATTEMPTS_FILE).read_text().splitlines()
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
    first = Path(layout.attempts_dir(4), ATTEMPTS_FILE).read_bytes()
    os.remove(layout.summary(4))
    assert evaluate.main(["--run-dir", run_dir, "--step", "4"]) == 0
    assert Path(layout.attempts_dir(4), ATTEMPTS_FILE).read_bytes() == first


def swapped_fingerprint_run(built_run, tmp_path) -> tuple[str, RunLayout]:
    """A copy of the run whose row of step 4 claims step 3's weights: a mis-recorded or swapped
    checkpoint (its evaluation fails fast, at the restore)."""
    run_dir = copy_run(built_run[0], tmp_path / "run")
    layout = RunLayout(run_dir)
    rows = {r.step: r for r in manifest.parse_rows(Path(layout.manifest).read_text(), "m")}
    manifest.upsert(
        layout.manifest,
        dataclasses.replace(rows[4], weights_fingerprint=rows[3].weights_fingerprint),
    )
    return run_dir, layout


def test_fingerprint_mismatch_gives_fatal_summary_and_nonzero_exit(built_run, tmp_path) -> None:
    run_dir, layout = swapped_fingerprint_run(built_run, tmp_path)
    assert evaluate.main(["--run-dir", run_dir, "--step", "4"]) == eval_cli.EXIT_FATAL
    summary = read_summary(layout.summary(4))
    assert summary.fatal_error is not None and "FingerprintMismatchError" in summary.fatal_error
    assert not summary.target_reached and not summary.complete
    assert gate.valid_summary(run_dir, manifest.load(layout.manifest).row(4)) is None
    assert not Path(layout.attempts_dir(4)).exists()  # no score was computed


def test_the_evaluation_is_recorded_while_it_reads_the_checkpoint_and_not_after(
    built_run, tmp_path, monkeypatch
) -> None:
    """Retention keeps a checkpoint whose evaluation runs: the record is there when the loader
    reads the checkpoint, gone once the summary is written (here a fatal one: the cheap way)."""
    run_dir, layout = swapped_fingerprint_run(built_run, tmp_path)
    seen: list[tuple[str | None, bool]] = []
    load = evaluate.ToyCheckpoints.load

    def reading(self, path: str, expected: str | None):  # the hook: the checkpoint is read
        seen.append((evaluating.running(run_dir, 4), Path(layout.summary(4)).exists()))
        return load(self, path, expected)

    monkeypatch.setattr(evaluate.ToyCheckpoints, "load", reading)
    assert evaluate.main(["--run-dir", run_dir, "--step", "4"]) == eval_cli.EXIT_FATAL
    [(record, summary_then)] = seen
    assert record is not None and record.startswith(f"{layout.evaluating(4)}: pid {os.getpid()}")
    assert not summary_then
    assert Path(layout.summary(4)).exists() and evaluating.running(run_dir, 4) is None


def test_a_sigterm_a_library_wrapped_during_the_restore_ends_with_143_and_no_summary(
    built_run, tmp_path, monkeypatch
) -> None:
    """On real pods (issue 46) a cancelled evaluation's SIGTERM landed in Orbax's restore, whose
    TensorStore read turned the `Terminated` into an error of its own: the evaluator wrote a
    fatal summary and exited 3. The signal decides: exit 143, no summary, no record."""
    import signal

    from tpu_jobs.rcp import termination

    monkeypatch.setattr(termination, "_received", [])
    run_dir, layout = swapped_fingerprint_run(built_run, tmp_path)

    def reading(self, path: str, expected: str | None):  # the hook: SIGTERM mid-restore
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except termination.Terminated as e:  # what Orbax did with it
            raise Exception(f"Encountered error while reading array index: {e!r}") from None
        raise AssertionError("SIGTERM was not raised")

    monkeypatch.setattr(evaluate.ToyCheckpoints, "load", reading)
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(termination.Terminated) as ended:
            evaluate.main(["--run-dir", run_dir, "--step", "4"])
    finally:
        signal.signal(signal.SIGTERM, before)
    assert ended.value.code == 143
    assert not Path(layout.summary(4)).exists() and evaluating.running(run_dir, 4) is None


def test_corrupted_weights_give_fatal_summary_then_a_fixed_checkpoint_is_re_evaluated(
    built_run, tmp_path
) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    layout = RunLayout(run_dir)
    row = manifest.load(layout.manifest).row(3)
    target, pristine = flip_a_bit_of_lm_head(built_run[1][3], row.checkpoint_path)
    proc = cli("--run-dir", run_dir, "--step", "3")
    assert proc.returncode == eval_cli.EXIT_FATAL
    assert "FingerprintMismatchError" in proc.stderr
    assert read_summary(layout.summary(3)).fatal_error is not None
    # A fatal summary is not reused: once the checkpoint is sound again it is evaluated.
    target.write_bytes(pristine)
    assert evaluate.main(["--run-dir", run_dir, "--step", "3"]) == 0
    assert validity_problems(read_summary(layout.summary(3)), row) == []


def test_unknown_step_is_bad_input(built_run, tmp_path) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    assert evaluate.main(["--run-dir", run_dir, "--step", "9"]) == eval_cli.EXIT_INVALID_INPUT
    assert not Path(RunLayout(run_dir).eval_dir(9)).exists()


def test_standalone_with_rcp_logging_writes_eval_events(built_run, tmp_path) -> None:
    row = manifest.load(RunLayout(built_run[0]).manifest).row(4)
    out = tmp_path / "out"
    proc = cli("--checkpoint", row.checkpoint_path, "--output-dir", str(out), "--rcp-logging")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = read_summary(str(out / "summary.json"))
    assert summary.checkpoint_step == 4 and summary.samples_count == 4 * GBS
    assert summary.checkpoint_timestamp_ms == row.timestamp_ms
    assert validity_problems(summary, row) == []
    events = parse((out / "mllog" / "eval.out").read_text())
    assert [e.key for e in events] == ["eval_start", "tracked_stats", "eval_accuracy", "eval_stop"]
    accuracy = events[2]
    assert accuracy.value == summary.eval_accuracy
    assert accuracy.metadata["samples_count"] == 4 * GBS
    assert events[0].time_ms == summary.eval_start_ms and events[3].time_ms == summary.eval_stop_ms


def test_standalone_refuses_half_written_checkpoint(built_run, tmp_path) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    step_path = manifest.load(RunLayout(run_dir).manifest).row(4).checkpoint_path
    os.remove(os.path.join(step_path, COMMIT_MARKER))
    out = tmp_path / "out"
    assert evaluate.main(["--checkpoint", step_path, "--output-dir", str(out)]) == 3
    assert "not a complete checkpoint" in read_summary(str(out / "summary.json")).fatal_error


# --- sharded evaluation (a GKE JobSet of N workers) -----------------------------------------

SHARD_ENV = (es.SLICE_INDEX_ENV, es.NUM_SLICES_ENV, es.ATTEMPT_ID_ENV)
WALL_CLOCK = ("eval_start_ms", "eval_stop_ms")


@pytest.fixture(autouse=True)
def no_shard_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SHARD_ENV:
        monkeypatch.delenv(name, raising=False)


def shard_args(
    run_dir: str, step: int, k: int, n: int, attempt: str, timeout_s: float
) -> list[str]:
    return [
        "--run-dir", run_dir, "--step", str(step), "--shard-index", str(k), "--num-shards", str(n),
        "--attempt-id", attempt, "--shard-timeout-s", str(timeout_s),
    ]  # fmt: skip


def attempts_of(instances: range) -> int:
    return len(instances) * recipe.EVAL_ATTEMPTS_PER_INSTANCE


def listing(attempts_dir: str) -> list[str]:
    return sorted(p.name for p in Path(attempts_dir).iterdir())


def without_wall_clock(summary) -> dict:
    d = dataclasses.asdict(summary)
    return {k: v for k, v in d.items() if k not in WALL_CLOCK}


def test_three_concurrent_shards_give_the_one_shard_result(built_run, tmp_path) -> None:
    one = copy_run(built_run[0], tmp_path / "one")
    three = copy_run(built_run[0], tmp_path / "three")
    env = {k: v for k, v in os.environ.items() if k not in SHARD_ENV}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tpu_jobs.evaluate", *shard_args(three, 3, k, 3, "t1", 240)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(3)
    ]
    try:
        assert evaluate.main(["--run-dir", one, "--step", "3"]) == 0  # meanwhile, one shard
        outputs = [proc.communicate(timeout=300) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for k, (proc, (_, err)) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"worker {k}: {err[-3000:]}"
    assert "shard 1 of 3 written" in outputs[1][0] and "shard 2 of 3 written" in outputs[2][0]

    row = manifest.load(RunLayout(three).manifest).row(3)
    s1, s3 = (read_summary(RunLayout(d).summary(3)) for d in (one, three))
    assert validity_problems(s3, row) == []
    assert without_wall_clock(s3) == without_wall_clock(s1)
    # Not a trivial agreement: the sampled attempts are a mix of right and wrong answers.
    assert 0 < s1.resolved_attempts < s1.expected_attempts
    a1, a3 = (RunLayout(d).attempts_dir(3) for d in (one, three))
    assert Path(a3, ATTEMPTS_FILE).read_bytes() == Path(a1, ATTEMPTS_FILE).read_bytes()
    assert listing(a1) == [ATTEMPTS_FILE]  # one shard: no shard files, as before
    assert listing(a3) == [ATTEMPTS_FILE] + [f"shard_{k}-of-3.jsonl" for k in range(3)]
    for k in range(3):
        lines = Path(a3, f"shard_{k}-of-3.jsonl").read_text().splitlines()
        header = json.loads(lines[0])
        assert header["identity"]["attempt_id"] == "t1" and header["fatal_error"] is None
        assert header["identity"]["weights_fingerprint"] == row.weights_fingerprint
        instances = {json.loads(line)["instance"] for line in lines[1:]}
        assert instances == set(range(k, 251, 3))


def test_missing_shard_gives_incomplete_summary_and_nonzero_exit(
    built_run, tmp_path, capsys
) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    layout = RunLayout(run_dir)
    row = manifest.load(layout.manifest).row(4)
    code = evaluate.main(shard_args(run_dir, 4, 0, 3, "try1", 0.5))
    assert code == eval_cli.EXIT_INCOMPLETE
    assert "shard(s) [1, 2] of 3 did not arrive" in capsys.readouterr().err
    summary = read_summary(layout.summary(4))
    assert not summary.complete and summary.fatal_error is None and not summary.target_reached
    assert summary.missing_attempts == attempts_of(range(1, 251, 3)) + attempts_of(range(2, 251, 3))
    assert summary.completed_attempts == attempts_of(range(0, 251, 3))
    assert gate.valid_summary(run_dir, row) is None  # never valid: no run_stop can come of it

    # The retry is a new attempt: all three workers again, then a valid summary.
    for k in (1, 2, 0):
        assert evaluate.main(shard_args(run_dir, 4, k, 3, "try2", 60)) == 0
    assert gate.valid_summary(run_dir, row) is not None


def test_stale_shard_from_an_earlier_attempt_is_not_merged(
    built_run, tmp_path, capsys, monkeypatch
) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    layout = RunLayout(run_dir)
    # Shard 2 from an earlier attempt: same checkpoint, so even the same attempts.
    assert evaluate.main(shard_args(run_dir, 3, 2, 3, "old", 60)) == 0
    # Worker 1 of this attempt learns its place from the environment, as a JobSet pod does.
    monkeypatch.setenv(es.SLICE_INDEX_ENV, "1")
    monkeypatch.setenv(es.NUM_SLICES_ENV, "3")
    monkeypatch.setenv(es.ATTEMPT_ID_ENV, "new")
    assert evaluate.main(["--run-dir", run_dir, "--step", "3"]) == 0
    assert Path(layout.attempts_dir(3), "shard_1-of-3.jsonl").exists()
    capsys.readouterr()
    code = evaluate.main(["--run-dir", run_dir, "--step", "3", "--shard-index", "0",
                          "--shard-timeout-s", "0.5"])  # fmt: skip
    assert code == eval_cli.EXIT_INCOMPLETE
    out = capsys.readouterr().out
    assert "ignoring" in out and "shard_2-of-3.jsonl" in out and "attempt_id 'old' != 'new'" in out
    summary = read_summary(layout.summary(3))
    assert summary.missing_attempts == attempts_of(range(2, 251, 3))


def test_fatal_error_in_another_worker_reaches_the_summary(built_run, tmp_path, capsys) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    layout = RunLayout(run_dir)
    row = manifest.load(layout.manifest).row(3)
    target, pristine = flip_a_bit_of_lm_head(built_run[1][3], row.checkpoint_path)
    # Worker 2 reads the damaged bytes (say, a bad read on its host): it records the error in its
    # shard and exits 0, so the JobSet does not restart worker 0 before it writes the summary.
    assert evaluate.main(shard_args(run_dir, 3, 2, 3, "t", 60)) == 0
    assert "FingerprintMismatchError" in capsys.readouterr().err
    target.write_bytes(pristine)
    assert evaluate.main(shard_args(run_dir, 3, 1, 3, "t", 60)) == 0
    assert evaluate.main(shard_args(run_dir, 3, 0, 3, "t", 60)) == eval_cli.EXIT_FATAL
    summary = read_summary(layout.summary(3))
    assert summary.fatal_error.startswith("shard 2 of 3: FingerprintMismatchError")
    assert not summary.complete and gate.valid_summary(run_dir, row) is None
    assert not Path(layout.attempts_dir(3), ATTEMPTS_FILE).exists()


def test_every_worker_reuses_a_valid_summary(built_run, tmp_path, capsys) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    layout = RunLayout(run_dir)
    assert evaluate.main(["--run-dir", run_dir, "--step", "4"]) == 0
    before = Path(layout.summary(4)).read_bytes()
    capsys.readouterr()
    for k in (2, 0):
        assert evaluate.main(shard_args(run_dir, 4, k, 3, "later", 0)) == 0
        assert "reusing valid summary" in capsys.readouterr().out
    assert Path(layout.summary(4)).read_bytes() == before
    assert listing(layout.attempts_dir(4)) == [ATTEMPTS_FILE]  # no shard was computed


def test_explicit_flags_win_over_the_environment(built_run, tmp_path, monkeypatch) -> None:
    run_dir = copy_run(built_run[0], tmp_path / "run")
    layout = RunLayout(run_dir)
    monkeypatch.setenv(es.SLICE_INDEX_ENV, "1")
    monkeypatch.setenv(es.NUM_SLICES_ENV, "3")
    monkeypatch.setenv(es.ATTEMPT_ID_ENV, "env")
    args = ["--run-dir", run_dir, "--step", "4", "--num-shards", "1", "--shard-index", "0"]
    assert evaluate.main(args) == 0
    assert listing(layout.attempts_dir(4)) == [ATTEMPTS_FILE]
    assert read_summary(layout.summary(4)).complete


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--num-shards", "3", "--attempt-id", "a"], {}, "--shard-index: not given"),
        ([], {es.SLICE_INDEX_ENV: "x", es.NUM_SLICES_ENV: "3"},
         f"--shard-index (from {es.SLICE_INDEX_ENV}='x'): not an integer"),
        (["--shard-index", "3", "--num-shards", "3", "--attempt-id", "a"], {},
         "--shard-index: shard index 3 is out of range 0..2"),
        (["--shard-index", "1", "--num-shards", "3"], {}, "--attempt-id: needed with 3 shards"),
        (["--shard-index", "one"], {}, "argument --shard-index: invalid int value"),
        (["--shard-timeout-s", "-1"], {}, "--shard-timeout-s must be >= 0"),
        (["--shard-timeout-s", "inf"], {}, "--shard-timeout-s must be >= 0 and at most"),
        (["--shard-timeout-s", "nan"], {}, "--shard-timeout-s must be >= 0 and at most"),
    ],
)  # fmt: skip
def test_bad_shard_settings_fail_naming_the_flag(tmp_path, monkeypatch, capsys, args, env, needle):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(["--run-dir", str(tmp_path), "--step", "3", *args])
    assert exit_info.value.code == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "eval").exists()
