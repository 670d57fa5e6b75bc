"""RCP hooks driven by a stand-in trainer (hooks_driver.py): rows, timestamps, crash and resume."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from trainer_runs import rows_of

from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.records import manifest
from rcpflow.records.mllog import read_events, run_start_ms
from rcpflow.trainer.recorder import RecorderError
from tpu_jobs.rcp.callbacks import RcpHooks
from tpu_jobs.rcp.checkpoint_format import CheckpointError, SavedCheckpoint, is_complete
from tpu_jobs.rcp.checkpoint_restore import read_meta, restore_params
from tpu_jobs.rcp.checkpoint_writer import CheckpointSaver
from tpu_jobs.rcp.fingerprint import weights_fingerprint
from tpu_jobs.rcp.saver import SaveFailedError

pytestmark = pytest.mark.timeout(600)

DRIVER = Path(__file__).with_name("hooks_driver.py")
REPO = Path(__file__).resolve().parents[3]
GBS, MAX_STEPS, VAL_START = 32, 6, 3
CRASH_EXIT_CODE = 17
# Linux stamps files from a coarse clock that can lag time.time() by up to one tick; a file
# written right after a timestamp may carry an mtime up to this much "before" it.
COARSE_CLOCK_NS = int(time.clock_getres(5) * 1e9)  # 5 = CLOCK_REALTIME_COARSE


def drive(run_dir: str, *extra: str, env: dict[str, str] | None = None) -> tuple[int, list[dict]]:
    proc = subprocess.run(
        [sys.executable, str(DRIVER), run_dir, "--gbs", str(GBS), "--max-steps", str(MAX_STEPS),
         "--val-start-at", str(VAL_START), *extra],
        capture_output=True, text=True, timeout=240, cwd=REPO,
        # this checkout's packages, not an installed copy's (a script's folder is on its path)
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )  # fmt: skip
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode not in (0, CRASH_EXIT_CODE):
        raise AssertionError(f"driver failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.returncode, lines


def assert_consistent(run_dir: str) -> list[manifest.ManifestRow]:
    """Every row points at a complete checkpoint whose record it matches; load() validates
    contiguity from val_start_at, one row per step and increasing timestamps."""
    layout = RunLayout(run_dir)
    if not storage_for(layout.manifest).exists(layout.manifest):
        return []
    rows = rows_of(run_dir)
    for row in rows:
        meta = read_meta(row.checkpoint_path)  # raises if not complete
        assert meta.step == row.step
        assert meta.timestamp_ms == row.timestamp_ms
        assert meta.weights_fingerprint == row.weights_fingerprint
    return rows


def assert_finished_run(run_dir: str, seed: int = 0) -> list[manifest.ManifestRow]:
    layout = RunLayout(run_dir)
    rows = assert_consistent(run_dir)
    assert [r.step for r in rows] == list(range(VAL_START, MAX_STEPS + 1))
    events = read_events(layout.mllog(seed))
    keys = [e.key for e in events]
    for key in ("init_start", "init_stop", "run_start", "block_start", "block_stop"):
        assert keys.count(key) == 1, (key, keys)
    assert "run_stop" not in keys and "eval_accuracy" not in keys
    start = run_start_ms(events)
    assert start is not None
    stamps = [r.timestamp_ms for r in rows]
    assert stamps == sorted(set(stamps))  # strictly increasing
    assert all(t > start for t in stamps)
    [block_stop] = [e for e in events if e.key == "block_stop"]
    assert block_stop.time_ms == rows[-1].timestamp_ms  # backdated to the last update
    assert block_stop.metadata["samples_count"] == MAX_STEPS * GBS
    for row in rows:
        params, _ = restore_params(row.checkpoint_path, row.weights_fingerprint)
        assert jax.tree.leaves(params)
    return rows


def checkpoint_files_min_mtime_ns(step_path: str) -> int:
    mtimes = [p.stat().st_mtime_ns for p in Path(step_path).rglob("*") if p.is_file()]
    assert mtimes
    return min(mtimes)


def test_fresh_run_rows_timestamps_and_block_stop(tmp_path) -> None:
    run_dir = str(tmp_path / "run")
    rc, updates = drive(run_dir)
    assert rc == 0
    rows = assert_finished_run(run_dir)
    # The rows carry exactly the timestamps the trainer's updates were given.
    stamped = {u["step"]: u["timestamp_ms"] for u in updates}
    assert [r.timestamp_ms for r in rows] == [stamped[r.step] for r in rows]
    assert [u["step"] for u in updates] == list(range(1, MAX_STEPS + 1))
    for row in rows:
        # Taken before the checkpoint write: older than every file of that checkpoint.
        assert (
            row.timestamp_ms * 1_000_000
            < checkpoint_files_min_mtime_ns(row.checkpoint_path) + COARSE_CLOCK_NS
        )
        assert row.samples_count == row.step * GBS
        assert row.checkpoint_path == str(tmp_path / "run" / "checkpoints" / str(row.step))
    # No checkpoint before the validation start.
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints"), key=int) == [
        str(s) for s in range(VAL_START, MAX_STEPS + 1)
    ]


def test_crash_during_commit_leaves_consistent_manifest_and_resume_completes(tmp_path) -> None:
    run_dir = str(tmp_path / "run")
    rc, first = drive(run_dir, "--crash-at-commit", "5")
    assert rc == CRASH_EXIT_CODE
    checkpoints = tmp_path / "run" / "checkpoints"
    # The interrupted save left its data behind, uncommitted.
    assert (checkpoints / "5.orbax-checkpoint-tmp").is_dir()
    assert not is_complete(str(checkpoints / "5"))
    rows = assert_consistent(run_dir)
    assert [r.step for r in rows] in ([3], [3, 4])  # row 4 may not have made it before the crash
    log_before = Path(RunLayout(run_dir).mllog(0)).read_text()
    assert "block_stop" not in log_before

    rc, second = drive(run_dir)
    assert rc == 0
    assert {u["resumed_from"] for u in second} == {4}
    assert [u["step"] for u in second] == [5, 6]
    rows = assert_finished_run(run_dir)
    assert sorted(os.listdir(checkpoints)) == ["3", "4", "5", "6"]  # tmp folder cleaned
    # The rows of the first attempt kept their timestamps; the resumed steps are later.
    stamped = {u["step"]: u["timestamp_ms"] for u in first + second}
    assert [r.timestamp_ms for r in rows] == [stamped[s] for s in range(3, 7)]
    # The log was continued, not restarted.
    assert Path(RunLayout(run_dir).mllog(0)).read_text().startswith(log_before)


def test_crash_between_commit_and_row_gets_the_row_on_resume(tmp_path) -> None:
    run_dir = str(tmp_path / "run")
    rc, first = drive(run_dir, "--crash-after-save", "4")
    assert rc == CRASH_EXIT_CODE
    assert is_complete(str(tmp_path / "run" / "checkpoints" / "4"))
    assert [r.step for r in assert_consistent(run_dir)] == [3]
    rc, second = drive(run_dir)
    assert rc == 0 and [u["step"] for u in second] == [5, 6]
    rows = assert_finished_run(run_dir)
    # Step 4's row comes from the checkpoint's own record: the original update's timestamp.
    step4 = {u["step"]: u["timestamp_ms"] for u in first}[4]
    assert rows[1].step == 4 and rows[1].timestamp_ms == step4


def test_rerun_of_a_finished_run_changes_nothing(tmp_path) -> None:
    run_dir = str(tmp_path / "run")
    assert drive(run_dir)[0] == 0
    layout = RunLayout(run_dir)
    before = (Path(layout.manifest).read_bytes(), Path(layout.mllog(0)).read_bytes())
    rc, updates = drive(run_dir)
    assert rc == 0 and updates == []
    assert (Path(layout.manifest).read_bytes(), Path(layout.mllog(0)).read_bytes()) == before


class Recorder:
    """What happened, in order, across the training thread and the saver's thread."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self._lock = threading.Lock()

    def note(self, *event: object) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, kind: str) -> list[tuple]:
        with self._lock:
            return [e for e in self.events if e[0] == kind]


def stand_in_loop(hooks: RcpHooks, record: Recorder) -> dict[int, tuple[int, str]]:
    """Steps 1..MAX_STEPS of a trainer that updates its (device) weights between calls."""
    params = {"layers": {"w": jnp.zeros((4, 3, 4))}, "head": jnp.ones(4)}
    passed = {}
    for step in range(1, MAX_STEPS + 1):
        params = jax.tree.map(lambda x, s=step: x + s, params)
        timestamp_ms = hooks.after_update(step, params, {"count": jnp.int32(step)})
        record.note("returned", step)
        passed[step] = (timestamp_ms, weights_fingerprint(params))
    return passed


def test_loop_does_not_wait_for_the_rows_and_rows_follow_commits(tmp_path, monkeypatch) -> None:
    """Process 0's hand-on of every committed checkpoint is held back until the whole loop has
    run: no after_update waits for one. Then each row appears only once its checkpoint is
    complete, in step order."""
    run_dir = str(tmp_path / "run")
    layout = RunLayout(run_dir)
    record = Recorder()
    release = threading.Event()
    watch, record_row = CheckpointSaver._watch, RcpHooks._on_commit

    def slow_watch(saver: CheckpointSaver, job: SavedCheckpoint) -> SavedCheckpoint:
        # Only a loop that waits for this hand-on would reach the timeout (and fail below).
        release.wait(timeout=30)
        return watch(saver, job)

    def recording_row(hooks: RcpHooks, saved: SavedCheckpoint) -> None:
        existing = storage_for(layout.manifest).exists(layout.manifest)
        before = [r.step for r in rows_of(run_dir)] if existing else []
        record.note("row", saved.step, is_complete(saved.path), before)
        record_row(hooks, saved)

    monkeypatch.setattr(CheckpointSaver, "_watch", slow_watch)
    monkeypatch.setattr(RcpHooks, "_on_commit", recording_row)
    hp = recipe.hyperparameters("closed", GBS, MAX_STEPS)
    hooks = RcpHooks(run_dir, 0, hp, VAL_START, max_pending_saves=MAX_STEPS)
    hooks.on_init_start()
    hooks.on_run_start()
    with hooks:
        passed = stand_in_loop(hooks, record)
        saved_steps = list(range(VAL_START, MAX_STEPS + 1))
        # Every after_update has returned while no commit was handed on: no row yet.
        assert hooks.saver.pending() == saved_steps
        assert record.of("row") == []
        assert not storage_for(layout.manifest).exists(layout.manifest)
        release.set()
        hooks.on_train_end()
    # In particular, after_update of step k+1 returned before step k's checkpoint committed.
    kinds = [e[0] for e in record.events]
    assert kinds == ["returned"] * MAX_STEPS + ["row"] * len(saved_steps)
    assert record.of("row") == [
        ("row", step, True, list(range(VAL_START, step))) for step in saved_steps
    ]
    rows = assert_finished_run(run_dir)
    assert [(r.timestamp_ms, r.weights_fingerprint) for r in rows] == [passed[r.step] for r in rows]


def test_a_failed_save_is_raised_in_the_training_thread(tmp_path, monkeypatch) -> None:
    run_dir = str(tmp_path / "run")
    watch = CheckpointSaver._watch

    def failing_watch(saver: CheckpointSaver, job: SavedCheckpoint) -> SavedCheckpoint:
        if job.step == 4:
            raise OSError("bucket unreachable (simulated)")
        return watch(saver, job)

    monkeypatch.setattr(CheckpointSaver, "_watch", failing_watch)
    hooks = RcpHooks(run_dir, 0, recipe.hyperparameters("closed", GBS, MAX_STEPS), VAL_START)
    hooks.on_init_start()
    hooks.on_run_start()
    # Raised by whichever call comes first after the failure: after_update(5 or 6) or the end.
    with (
        pytest.raises(SaveFailedError, match=r"step 4: .*bucket unreachable") as failure,
        hooks,
    ):
        stand_in_loop(hooks, Recorder())
        hooks.on_train_end()
    # Reported once: closing the saver on the way out does not add the same failure as a note.
    assert getattr(failure.value, "__notes__", []) == []
    assert [r.step for r in assert_consistent(run_dir)] == [3]  # no row past the failure
    keys = [e.key for e in read_events(RunLayout(run_dir).mllog(0))]
    assert "block_stop" not in keys  # the run did not finish


def _hooks(run_dir: str, gbs: int = GBS) -> RcpHooks:
    return RcpHooks(run_dir, 0, recipe.hyperparameters("closed", gbs, MAX_STEPS), VAL_START)


def test_resume_refuses_a_checkpoint_of_another_run(tmp_path) -> None:
    run_dir = str(tmp_path / "run")
    assert drive(run_dir, "--crash-after-save", "4")[0] == CRASH_EXIT_CODE
    hooks = _hooks(run_dir, gbs=64)
    with pytest.raises(CheckpointError, match=r"step 4: .* belongs to run"):
        hooks.resume(params_like={}, state_like={})
    hooks.saver.close()


def test_resume_refuses_a_row_without_its_checkpoint(tmp_path) -> None:
    run_dir = str(tmp_path / "run")
    assert drive(run_dir, "--crash-at-commit", "6")[0] == CRASH_EXIT_CODE
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "3")
    hooks = _hooks(run_dir)
    with pytest.raises(CheckpointError, match="step 3: manifest row points at"):
        hooks.resume(params_like={}, state_like={})
    hooks.saver.close()


def test_after_update_rejects_skipped_or_out_of_range_steps(tmp_path) -> None:
    hooks = _hooks(str(tmp_path / "run"))
    hooks.on_init_start()
    hooks.on_run_start()
    params = {"w": jax.numpy.ones(3)}
    hooks.after_update(1, params, {})
    with pytest.raises(ValueError, match="step 3: expected step 2"):
        hooks.after_update(3, params, {})
    fresh = _hooks(str(tmp_path / "other"))
    fresh.on_init_start()
    fresh.on_run_start()
    # The range is the recorder's contract; the hooks pass its refusal on before any save.
    with pytest.raises(RecorderError, match=r"step 7: outside 1\.\.max_steps"):
        fresh.after_update(MAX_STEPS + 1, params, {})
    assert fresh.saver.pending() == []
    with pytest.raises(ValueError, match="val_start_at 9"):
        RcpHooks(str(tmp_path / "x"), 0, recipe.hyperparameters("closed", GBS, MAX_STEPS), 9)
    hooks.saver.close()
    fresh.saver.close()


@pytest.mark.gcs
def test_gcs_crash_and_resume(gcs, gcs_prefix) -> None:
    run_dir = f"{gcs_prefix}/run"
    rc, _ = drive(run_dir, "--crash-at-commit", "5", env=gcs.env)
    assert rc == CRASH_EXIT_CODE
    # On GCS the half-written step sits at its final name, without the commit marker.
    assert storage_for(run_dir).list(f"{run_dir}/checkpoints/5")
    assert not is_complete(f"{run_dir}/checkpoints/5")
    assert [r.step for r in assert_consistent(run_dir)] in ([3], [3, 4])
    rc, second = drive(run_dir, env=gcs.env)
    assert rc == 0 and [u["step"] for u in second] == [5, 6]
    rows = assert_finished_run(run_dir)
    assert rows[0].checkpoint_path == f"{run_dir}/checkpoints/3"
