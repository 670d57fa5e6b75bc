"""The trainer recorder and `rcpflow manifest add`: a foreign trainer's run, resumed, backdated,
with rows committed from saver threads; the official checker on the log it writes + finalize."""

from __future__ import annotations

import random
import subprocess
import threading
from pathlib import Path

import pytest
from rcpflow_cli import run_cli

from devtools.synthetic_run import evaluated, rows_of
from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.records.mllog import read_events
from rcpflow.submission import checkers
from rcpflow.trainer.recorder import RecorderError, Resumed, TrainingRecorder
from rcpflow.verdict.finalize import finalize

GBS, MAX_STEPS, VAL_START = 256, 24, 18
T0 = 1_700_000_000_000


def recorder(run_dir: str, seed: int = 1, owner: str | None = None) -> TrainingRecorder:
    hp = recipe.hyperparameters("closed", GBS, MAX_STEPS)
    return TrainingRecorder(
        run_dir, seed=seed, hyperparameters=hp, val_start_at=VAL_START, owner=owner
    )


def checkpoint(run_dir: str, step: int) -> str:
    """The trainer's own checkpoint folder (not Orbax: any files)."""
    path = Path(run_dir) / "checkpoints" / str(step)
    path.mkdir(parents=True, exist_ok=True)
    (path / "weights.bin").write_bytes(b"w" * step)
    return str(path)


def train(rec: TrainingRecorder, run_dir: str, steps: range, t0: int = T0) -> None:
    for step in steps:
        ts = rec.on_update(step, timestamp_ms=t0 + 60_000 + step * 1_000)
        if step >= VAL_START:
            rec.on_checkpoint_committed(step, checkpoint(run_dir, step))
        assert ts == t0 + 60_000 + step * 1_000


def keys(run_dir: str, seed: int = 1) -> list[str]:
    return [e.key for e in read_events(RunLayout(run_dir).mllog(seed))]


def test_fresh_run_rows_and_backdated_block_stop(tmp_path):
    run_dir = str(tmp_path / "run")
    rec = recorder(run_dir)
    assert rec.resume() is None
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    train(rec, run_dir, range(1, MAX_STEPS + 1))
    rec.on_train_end()
    rec.on_train_end()  # idempotent
    rows = rows_of(run_dir)
    assert [r.step for r in rows] == list(range(VAL_START, MAX_STEPS + 1))
    assert rows[0].checkpoint_path == str(tmp_path / "run" / "checkpoints" / "18")  # resolved
    assert rows[0].timestamp_ms == T0 + 60_000 + 18_000 and rows[0].samples_count == 18 * GBS
    (stop,) = [e for e in read_events(rec.mllog_path) if e.key == "block_stop"]
    assert stop.time_ms == T0 + 60_000 + MAX_STEPS * 1_000  # the last update, not "now"
    assert (stop.metadata["samples_count"], stop.metadata["step"]) == (MAX_STEPS * GBS, MAX_STEPS)
    assert keys(run_dir).count("run_start") == 1 and "run_stop" not in keys(run_dir)


def test_the_official_checker_passes_a_recorded_run_after_finalize(tmp_path):
    run_dir = str(tmp_path / "run")
    rec = recorder(run_dir)
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    train(rec, run_dir, range(1, 21))
    rec.on_train_end()
    rows = rows_of(run_dir)
    for row, accuracy in zip(rows[:2], (0.5, 0.75), strict=True):  # steps 18 and 19
        evaluated(run_dir, row, accuracy, row.timestamp_ms + 3_600_000)
    result = finalize(run_dir)
    assert (result.status, result.step, result.time_ms) == ("success", 19, rows[1].timestamp_ms)
    check = checkers.compliance(rec.mllog_path, "closed", log_dir=str(tmp_path / "checks"))
    assert check.ok, check.output


def test_resume_continues_the_log_and_rows(tmp_path):
    run_dir = str(tmp_path / "run")
    rec = recorder(run_dir)
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    train(rec, run_dir, range(1, 21))  # crash after step 20's row
    log_before = Path(rec.mllog_path).read_text()

    again = recorder(run_dir)
    resumed = again.resume()
    assert resumed is not None
    assert (resumed.step, resumed.timestamp_ms, resumed.finished) == (20, T0 + 80_000, False)
    again.on_init_start()
    again.on_run_start()
    assert Path(again.mllog_path).read_text() == log_before  # no second header or run_start
    with pytest.raises(RecorderError, match="step 20: not after the last update, step 20"):
        again.on_update(20)
    train(again, run_dir, range(21, MAX_STEPS + 1))
    again.on_train_end()
    assert keys(run_dir).count("run_start") == 1 and keys(run_dir).count("block_stop") == 1
    assert [r.step for r in rows_of(run_dir)] == list(range(18, 25))

    finished = recorder(run_dir)
    assert finished.resume().finished
    finished.on_train_end()  # nothing more is logged
    assert keys(run_dir).count("block_stop") == 1
    with pytest.raises(RecorderError, match="after on_train_end"):
        finished.on_update(25)


def test_resume_refuses_a_log_of_another_run(tmp_path):
    run_dir = str(tmp_path / "run")
    rec = recorder(run_dir, seed=1)
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    train(rec, run_dir, range(1, 19))
    hp = recipe.hyperparameters("closed", 512, MAX_STEPS)
    other = TrainingRecorder(run_dir, seed=1, hyperparameters=hp, val_start_at=10)
    with pytest.raises(RecorderError, match="logs global_batch_size 256, this run has 512"):
        other.resume()
    Path(rec.mllog_path).unlink()
    with pytest.raises(RecorderError, match="exists but the run's MLLOG"):
        recorder(run_dir).resume()


def test_refusals_name_the_step(tmp_path):
    run_dir = str(tmp_path / "run")
    rec = recorder(run_dir)
    with pytest.raises(RecorderError, match="before on_run_start"):
        rec.on_update(1)
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    with pytest.raises(RecorderError, match="before run_start"):
        rec.on_update(1, timestamp_ms=T0)
    rec.on_update(17, timestamp_ms=T0 + 50_000)
    with pytest.raises(RecorderError, match="step 17: before val_start_at 18"):
        rec.on_checkpoint_committed(17, checkpoint(run_dir, 17))
    with pytest.raises(RecorderError, match=r"step 18: timestamp_ms .* is not after step 17's"):
        rec.on_update(18, timestamp_ms=T0 + 50_000)
    rec.on_update(18, timestamp_ms=T0 + 51_000)
    with pytest.raises(RecorderError, match="step 18: no checkpoint at"):
        rec.on_checkpoint_committed(18, str(tmp_path / "nowhere"))
    with pytest.raises(RecorderError, match="step 19: no on_update"):
        rec.on_checkpoint_committed(19, checkpoint(run_dir, 19))
    with pytest.raises(RecorderError, match=r"extra field.*color"):
        rec.on_checkpoint_committed(18, checkpoint(run_dir, 18), {"color": "red"})
    row = rec.on_checkpoint_committed(18, checkpoint(run_dir, 18), {"weights_fingerprint": "ab"})
    assert row.weights_fingerprint == "ab"
    rec.on_update(19, timestamp_ms=T0 + 52_000)
    rec.on_update(20, timestamp_ms=T0 + 53_000)
    rec.on_checkpoint_committed(20, checkpoint(run_dir, 20))
    with pytest.raises(RecorderError, match="steps 19 have no committed checkpoint row"):
        rec.on_train_end()  # 19 never committed: a gap; no block_stop
    assert "block_stop" not in keys(run_dir)


def test_rows_commit_from_many_threads_in_any_order(tmp_path):
    run_dir = str(tmp_path / "run")
    rec = recorder(run_dir)
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    paths = {s: checkpoint(run_dir, s) for s in range(VAL_START, MAX_STEPS + 1)}
    for step in range(1, MAX_STEPS + 1):
        rec.on_update(step)  # the clock: strictly increasing, even within one ms
    order = list(paths)
    random.Random(3).shuffle(order)
    barrier = threading.Barrier(len(order))
    errors: list[BaseException] = []

    def commit(step: int) -> None:
        barrier.wait()
        try:
            rec.on_checkpoint_committed(step, paths[step])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=commit, args=(s,)) for s in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rec.on_train_end()
    rows = rows_of(run_dir)  # validates contiguity and timestamps
    assert [r.step for r in rows] == list(range(VAL_START, MAX_STEPS + 1))


def test_manifest_add_for_a_trainer_that_is_not_python(tmp_path):
    run_dir = str(tmp_path / "run")
    # Stands for the foreign trainer's own MLLOG writer; its adds name the same owner.
    rec = recorder(run_dir, owner="foreign-trainer")
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)

    def add(step: int, ts: int, *extra: str) -> subprocess.CompletedProcess[str]:
        ck = checkpoint(run_dir, step)
        return run_cli(
            "manifest",
            "add",
            run_dir,
            "--step",
            str(step),
            "--checkpoint",
            ck,
            "--timestamp-ms",
            str(ts),
            "--owner",
            "foreign-trainer",
            *extra,
        )

    p = add(19, T0 + 79_000)
    assert p.returncode == 1 and "the first row is the validation start step 18" in p.stderr
    p = add(18, T0 + 78_000)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("step 18: row added")
    assert add(18, T0 + 78_000).stdout.startswith("step 18: row already there")
    p = add(18, T0 + 78_001)
    assert p.returncode == 1 and "step 18: already recorded" in p.stderr
    p = add(19, T0 + 77_000)
    assert p.returncode == 1 and "step 19: timestamp_ms" in p.stderr and "not after" in p.stderr
    p = add(19, T0 + 10_000)
    assert p.returncode == 1 and "before run_start" in p.stderr
    p = run_cli(
        "manifest",
        "add",
        run_dir,
        "--step",
        "19",
        "--checkpoint",
        str(tmp_path / "none"),
        "--timestamp-ms",
        str(T0 + 79_000),
        "--owner",
        "foreign-trainer",
    )
    assert p.returncode == 1 and "step 19: no checkpoint at" in p.stderr
    assert add(19, T0 + 79_000).returncode == 0
    p = add(21, T0 + 81_000)
    assert p.returncode == 1 and "steps 20 missing between 19 and 21" in p.stderr
    rows = rows_of(run_dir)
    assert [(r.step, r.seed, r.val_start_at, r.global_batch_size) for r in rows] == [
        (18, 1, 18, GBS),
        (19, 1, 18, GBS),
    ]
    p = add(20, T0 + 80_000, "--val-start-at", "10")
    assert p.returncode == 1 and "val_start_at 10 differs" in p.stderr


def test_without_rcp_logging_rows_are_recorded_and_resumed(tmp_path):
    run_dir = str(tmp_path / "run")
    hp = recipe.hyperparameters("closed", GBS, MAX_STEPS)

    def make() -> TrainingRecorder:
        return TrainingRecorder(
            run_dir, seed=1, hyperparameters=hp, val_start_at=VAL_START, rcp_logging=False
        )

    rec = make()
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    train(rec, run_dir, range(1, 20))
    assert not Path(RunLayout(run_dir).mllog(1)).exists()
    again = make()
    assert again.resume() == Resumed(step=19, timestamp_ms=T0 + 79_000, finished=False)
    train(again, run_dir, range(20, MAX_STEPS + 1))
    again.on_train_end()
    assert [r.step for r in rows_of(run_dir)] == list(range(18, 25))
