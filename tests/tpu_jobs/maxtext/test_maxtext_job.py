"""The MaxText jobs in MaxText's environment: one small run (32 prompts a step, 4 updates,
checkpoints from step 2), read back as finalize and the evaluator read it.

- recording: a manifest row per committed checkpoint, in step order, after its update; the
  update times in the rows, the checkpoints' records and the log agree; ``block_stop`` at the
  last update, no ``run_stop``;
- the checkpoints are MaxText's native scanned ones (layer axis 1), their weights the ones the
  rows name (read back with Orbax and fingerprinted);
- MaxText's converter and ``from_pretrained(scan_layers=false)``: every restored tensor is the
  scanned one sliced on the layer axis and rounded to bf16, bit for bit, and its fingerprint in
  the scanned layout is the one training recorded;
- the evaluator scores a step after that check; a stop request ends training after the update
  that sees it.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from maxtext_harness import MaxTextEnv

from devtools.synthetic_run import evaluated
from rcpflow.files.layout import RunLayout
from rcpflow.records import manifest
from rcpflow.records.manifest import ManifestRow
from rcpflow.records.mllog import read_events, run_start_ms
from rcpflow.submission.checkers import compliance
from rcpflow.trainer.recorder import now_ms
from rcpflow.verdict import gate
from rcpflow.verdict.finalize import finalize
from tpu_jobs.maxtext.checkpoints import read_record

pytestmark = pytest.mark.timeout(900)

SEED, GBS, VAL_START, MAX_STEPS, LAYERS = 0, 32, 2, 4, 2


def printed(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def trained(maxtext: MaxTextEnv, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("maxtext") / "run"
    proc = maxtext.run(
        ["-m", "tpu_jobs.maxtext.train", "--run-dir", str(run_dir), "--seed", str(SEED),
         "--global-batch-size", str(GBS), "--val-start-at", str(VAL_START),
         "--max-steps", str(MAX_STEPS), "--num-layers", str(LAYERS)],
        binds=[str(run_dir.parent)],
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    (run_dir.parent / "stdout").write_text(proc.stdout)
    return run_dir


def check_rows(run_dir: Path, last: int) -> list[ManifestRow]:
    """Rows val_start..last at committed scanned checkpoints holding their records, after
    run_start and one after another; block_stop at the last update; no run_stop."""
    layout = RunLayout(str(run_dir))
    loaded = manifest.load(layout.manifest)
    rows = list(loaded.rows)
    assert [r.step for r in rows] == list(range(VAL_START, last + 1)) and not loaded.stale_steps
    assert [r.samples_count for r in rows] == [r.step * GBS for r in rows]
    events = read_events(layout.mllog(SEED))
    keys = [e.key for e in events]
    start = run_start_ms(events)
    stamps = [r.timestamp_ms for r in rows]
    assert start is not None and stamps[0] > start
    assert all(b > a for a, b in itertools.pairwise(stamps))
    assert keys.count("run_start") == 1 and "run_stop" not in keys
    [block_stop] = [e for e in events if e.key == "block_stop"]
    assert block_stop.time_ms == stamps[-1]
    assert (block_stop.metadata["step"], block_stop.metadata["samples_count"]) == (last, last * GBS)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        str(r.step) for r in rows
    ]
    for row in rows:
        record = read_record(row.checkpoint_path)
        assert (record.step, record.timestamp_ms) == (row.step, row.timestamp_ms)
        assert record.weights_fingerprint == row.weights_fingerprint
        assert record.run == {
            "seed": SEED, "global_batch_size": GBS, "val_start_at": VAL_START,
            "max_steps": row.max_steps,
        }  # fmt: skip
    return rows


def test_a_maxtext_run_records_each_scanned_checkpoint_after_its_update(trained: Path) -> None:
    rows = check_rows(trained, MAX_STEPS)
    out = printed((trained.parent / "stdout").read_text())
    steps = [o for o in out if "timestamp_ms" in o]
    assert [o["step"] for o in steps] == [1, 2, 3, 4]
    assert [o["timestamp_ms"] for o in steps[1:]] == [r.timestamp_ms for r in rows]
    [start] = [o for o in out if o.get("event") == "start"]
    assert start["trainer"] == "maxtext" and start["val_start_at"] == VAL_START
    assert {r.weights_fingerprint for r in rows} == {
        read_record(r.checkpoint_path).weights_fingerprint for r in rows
    } and len({r.weights_fingerprint for r in rows}) == len(rows)  # every update changed them


@pytest.fixture(scope="module")
def converted(maxtext: MaxTextEnv, trained: Path) -> dict:
    """Step 3 read back scanned, then converted and restored unscanned (in_env.py convert)."""
    return maxtext.helper("convert", trained, 3)


def test_a_checkpoint_is_maxtexts_scanned_layout_holding_the_rows_weights(
    trained: Path, converted: dict
) -> None:
    found = converted["scanned"]
    shapes = {name: tuple(shape) for name, shape, _ in found["shapes"]}
    emb, mlp, heads, head_dim = 64, 128, 2, 32
    assert shapes["decoder/layers/mlp/wi_0/kernel"] == (emb, LAYERS, mlp)  # layer axis 1
    assert shapes["decoder/layers/pre_self_attention_layer_norm/scale"] == (emb, LAYERS)
    assert shapes["decoder/layers/self_attention/out/kernel"] == (heads, LAYERS, head_dim, emb)
    assert shapes["decoder/decoder_norm/scale"] == (emb,)  # not a layer's: not stacked
    assert {dtype for _, _, dtype in found["shapes"]} == {"float32"}
    [row] = [r for r in manifest.load(RunLayout(str(trained)).manifest).rows if r.step == 3]
    assert found["fingerprint"] == row.weights_fingerprint
    assert found["fingerprint_bf16"] == found["record"]["weights_fingerprint_bf16"]


def test_maxtexts_conversion_and_restore_keep_every_weight_and_the_fingerprint(
    converted: dict,
) -> None:
    found = converted
    restored = {name: (tuple(shape), dtype) for name, shape, dtype in found["restored_shapes"]}
    assert restored["decoder/layers_1/mlp/wi_0/kernel"] == ((64, 128), "bfloat16")
    assert not [name for name in restored if name.startswith("decoder/layers/")]
    assert sorted(restored) == sorted(found["leaves"])
    assert found["all_equal"] and not found["unequal"]
    assert found["fingerprint_restored"] == found["record"]["weights_fingerprint_bf16"]
    assert "refusing to score" in found["refused"]


@pytest.mark.slow
def test_the_evaluator_scores_a_step_once_its_unscanned_weights_are_checked(
    maxtext: MaxTextEnv, trained: Path
) -> None:
    proc = maxtext.run(
        ["-m", "tpu_jobs.maxtext.evaluate", "--run-dir", str(trained), "--step", "4"],
        binds=[str(trained.parent)],
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    [converted] = [o for o in printed(proc.stdout) if o.get("event") == "unscanned"]
    assert converted["step"] == 4 and converted["conversion_s"] > 0
    [row] = [r for r in manifest.load(RunLayout(str(trained)).manifest).rows if r.step == 4]
    summary = gate.valid_summary(str(trained), row)
    assert summary is not None and summary.complete and summary.fatal_error is None
    assert summary.expected_attempts == 251 * 4


@pytest.mark.slow
def test_a_stop_request_ends_maxtext_training_after_the_current_update(
    maxtext: MaxTextEnv, tmp_path: Path
) -> None:
    """While update 4 (of 8) is recorded, the request for step 3 is written, as the orchestrator
    writes it once step 3 has passed: training ends after update 4 with every started save
    committed and its row written; finalize ends the run at step 3 and the official checker
    passes the log."""
    run_dir = tmp_path / "run"
    result = maxtext.helper("train-stop", run_dir, 8)
    assert (result["first_step"], result["last_step"], result["resumed_from"]) == (1, 4, None)
    rows = check_rows(run_dir, 4)
    evaluated(str(run_dir), rows[0], 0.4, now_ms())
    evaluated(str(run_dir), rows[1], 0.8, now_ms())
    verdict = finalize(str(run_dir))
    assert (verdict.status, verdict.step, verdict.time_ms) == ("success", 3, rows[1].timestamp_ms)
    layout = RunLayout(str(run_dir))
    check = compliance(layout.mllog(SEED), division="open", log_dir=str(tmp_path / "checks"))
    assert check.ok, check


@pytest.mark.slow
def test_a_rerun_resumes_from_the_newest_checkpoint_maxtext_restores(
    maxtext: MaxTextEnv, tmp_path: Path
) -> None:
    """The job dies while update 4 (of 6) is recorded, after step 3's row; the rerun with the
    same flags has MaxText restore step 3, trains 4..6 into the same log (one run_start) and
    rows; a third run finds the log ended and trains nothing."""
    run_dir = tmp_path / "run"
    died = maxtext.helper("train-crash", run_dir, 6)
    assert "simulated preemption" in died["died"]
    before = manifest.read_rows(RunLayout(str(run_dir)).manifest)
    assert [r.step for r in before] == [2, 3]
    flags = ["--run-dir", str(run_dir), "--seed", str(SEED), "--global-batch-size", str(GBS),
             "--val-start-at", str(VAL_START), "--max-steps", "6"]  # fmt: skip
    proc = maxtext.run(["-m", "tpu_jobs.maxtext.train", *flags], binds=[str(tmp_path)])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    out = printed(proc.stdout)
    assert [o["step"] for o in out if "timestamp_ms" in o] == [4, 5, 6]
    [done] = [o for o in out if o.get("event") == "done"]
    assert done["resumed_from"] == 3
    rows = check_rows(run_dir, 6)
    assert manifest.read_rows(RunLayout(str(run_dir)).manifest)[:2] == before  # kept as written
    again = maxtext.run(["-m", "tpu_jobs.maxtext.train", *flags], binds=[str(tmp_path)])
    assert again.returncode == 0, (again.stdout + again.stderr)[-6000:]
    assert {"event": "nothing_to_train", "step": 6} in printed(again.stdout)
    assert check_rows(run_dir, 6) == rows
