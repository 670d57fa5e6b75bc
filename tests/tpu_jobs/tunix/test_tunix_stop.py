"""The Tunix job honours its run's stop request (`rcpflow.verdict.stop_request`) like the toy
trainer.

In process, with the request written at a chosen point of Tunix's loop (from the recorder's
``on_update``, which Tunix reaches through the checkpoint-metadata call of each update), so the
step training ends at is known: a request that stands once update N is recorded ends training
after update N. A request for another run, or for a step this run has not committed, is
ignored. Summaries are built with `rcpflow.records.summary` (pass@4 chosen, not sampled): what is
under test is the training section; the Tunix evaluation has its own tests (test_tunix_job.py).

Skipped only when the ``tunix`` extra is not installed (CI installs it with ``.[all]``).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from trainer_runs import written_rows

from devtools.synthetic_run import evaluated
from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.records import manifest
from rcpflow.records.manifest import ManifestRow
from rcpflow.records.mllog import read_events, run_start_ms
from rcpflow.submission.checkers import compliance
from rcpflow.trainer.recorder import TrainingRecorder, now_ms
from rcpflow.verdict import stop_request
from rcpflow.verdict.finalize import finalize
from tpu_jobs.rcp.checkpoint_format import is_complete

_WHY = "google-tunix (the project's `tunix` extra) is not installed"
checkpoints = pytest.importorskip("tpu_jobs.tunix.checkpoints", reason=_WHY)
train = pytest.importorskip("tpu_jobs.tunix.train", reason=_WHY)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SEED, GBS, VAL_START = 0, 32, 2
ROW_WAIT_S = 300.0


def config(run_dir: str, max_steps: int) -> train.TrainConfig:
    return train.TrainConfig(
        run_dir=run_dir, seed=SEED, global_batch_size=GBS, max_steps=max_steps,
        val_start_at=VAL_START,
    )  # fmt: skip


def wait_for_row(run_dir: str, step: int) -> ManifestRow:
    """The row of `step`, once the job's commit watcher has written it."""
    deadline = time.monotonic() + ROW_WAIT_S
    while time.monotonic() < deadline:
        found = [r for r in written_rows(run_dir) if r.step == step]
        if found:
            return found[0]
        time.sleep(0.01)
    raise AssertionError(f"step {step}: no manifest row within {ROW_WAIT_S:.0f} s")


def identity(run_dir: str, max_steps: int, seed: int = SEED) -> stop_request.RunIdentity:
    start = run_start_ms(read_events(RunLayout(run_dir).mllog(SEED)))
    return stop_request.RunIdentity(seed, GBS, VAL_START, max_steps, start)


def write_request(run_dir: str, request: stop_request.StopRequest) -> None:
    path = RunLayout(run_dir).stop_request
    storage_for(path).write_atomic(path, request.to_json())


def act_during_update(
    monkeypatch: pytest.MonkeyPatch, at_step: int, act: Callable[[dict[int, int]], None]
) -> dict[int, int]:
    """Run `act` (given the update timestamps so far) as update `at_step` is being recorded,
    before its timestamp is taken; returns the timestamps of every update, as they come."""
    stamps: dict[int, int] = {}
    original = TrainingRecorder.on_update

    def on_update(self: TrainingRecorder, step: int, timestamp_ms: int | None = None) -> int:
        if step == at_step:
            act(dict(stamps))
        stamps[step] = original(self, step, timestamp_ms)
        return stamps[step]

    monkeypatch.setattr(TrainingRecorder, "on_update", on_update)
    return stamps


def printed(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def check_stopped_run(run_dir: str, last: int) -> list[ManifestRow]:
    """Rows val_start..last, each at a committed checkpoint with its record, none beyond;
    block_stop backdated to update `last`; one run_start."""
    layout = RunLayout(run_dir)
    loaded = manifest.load(layout.manifest)
    rows = list(loaded.rows)
    assert [r.step for r in rows] == list(range(VAL_START, last + 1)) and not loaded.stale_steps
    events = read_events(layout.mllog(SEED))
    start = run_start_ms(events)
    stamps = [r.timestamp_ms for r in rows]
    assert start is not None and stamps[0] > start
    assert all(b > a for a, b in itertools.pairwise(stamps))
    assert [e.key for e in events].count("run_start") == 1
    [block_stop] = [e for e in events if e.key == "block_stop"]
    assert block_stop.time_ms == stamps[-1]
    assert (block_stop.metadata["step"], block_stop.metadata["samples_count"]) == (last, last * GBS)
    root = os.path.join(run_dir, "checkpoints")
    assert sorted(os.listdir(os.path.join(root, "actor")), key=int) == [str(r.step) for r in rows]
    for row in rows:
        assert is_complete(row.checkpoint_path)
        global_step, record = checkpoints.read_record(row.checkpoint_path)
        assert (global_step, record.step, record.timestamp_ms) == (
            row.step, row.step, row.timestamp_ms,
        )  # fmt: skip
        assert record.weights_fingerprint == row.weights_fingerprint
    return rows


def test_a_stop_request_ends_tunix_training_after_the_current_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """While update 4 is recorded, step 3's checkpoint is committed and evaluated above the
    target (step 2 below): `request_stop` decides the run and writes the request. Training ends
    after update 4 (of 8) with every queued save committed and its row written, block_stop at
    update 4; finalize ends the run at step 3 and the official checker passes the log. A rerun
    trains nothing and changes nothing."""
    run_dir, max_steps = str(tmp_path / "run"), 8
    requests: list[stop_request.StopRequest | None] = []

    def decide(_: dict[int, int]) -> None:
        rows = {s: wait_for_row(run_dir, s) for s in (2, 3)}
        evaluated(run_dir, rows[2], 0.4, now_ms())
        evaluated(run_dir, rows[3], 0.8, now_ms())
        requests.append(stop_request.request_stop(run_dir))

    act_during_update(monkeypatch, 4, decide)
    result = train.train(config(run_dir, max_steps))

    [request] = requests
    assert request is not None and request.step == 3
    assert request.run == identity(run_dir, max_steps)
    out = printed(capsys.readouterr().out)
    assert [o["step"] for o in out if "timestamp_ms" in o] == [1, 2, 3, 4]
    assert {"event": "stop_requested", "step": 4} in out
    assert (result.first_step, result.last_step, result.resumed_from) == (1, 4, None)
    rows = check_stopped_run(run_dir, 4)
    assert request.timestamp_ms == rows[1].timestamp_ms

    layout = RunLayout(run_dir)
    before = {p: Path(p).read_bytes() for p in (layout.manifest, layout.mllog(SEED))}
    again = train.train(config(run_dir, max_steps))  # its log has ended: nothing to train
    assert (again.last_step, again.resumed_from) == (4, 4)
    assert not [o for o in printed(capsys.readouterr().out) if "timestamp_ms" in o]
    assert {p: Path(p).read_bytes() for p in before} == before

    verdict = finalize(run_dir)
    assert (verdict.status, verdict.step, verdict.time_ms) == ("success", 3, rows[1].timestamp_ms)
    check = compliance(layout.mllog(SEED), division="open", log_dir=str(tmp_path / "checks"))
    assert check.ok, check


def test_a_stop_request_standing_at_a_resume_ends_training_without_another_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job dies while update 4 is recorded (after step 3's checkpoint, before block_stop);
    the request for step 3 is written meanwhile. The rerun restores step 3, honours the
    request before training and logs block_stop at update 3."""
    run_dir, max_steps = str(tmp_path / "run"), 6

    def die(_: dict[int, int]) -> None:
        wait_for_row(run_dir, 3)
        raise RuntimeError("simulated preemption while update 4 is recorded")

    act_during_update(monkeypatch, 4, die)
    with pytest.raises(RuntimeError, match="simulated preemption"):
        train.train(config(run_dir, max_steps))
    rows = written_rows(run_dir)
    assert [r.step for r in rows] == [2, 3]
    assert not [e for e in read_events(RunLayout(run_dir).mllog(SEED)) if e.key == "block_stop"]
    write_request(run_dir, stop_request.StopRequest(
        identity(run_dir, max_steps), step=3, timestamp_ms=rows[1].timestamp_ms, reason="test",
    ))  # fmt: skip
    monkeypatch.undo()
    capsys.readouterr()

    result = train.train(config(run_dir, max_steps))
    out = printed(capsys.readouterr().out)
    assert not [o for o in out if "timestamp_ms" in o]  # no update
    assert {"event": "stop_requested", "step": 3} in out
    assert (result.first_step, result.last_step, result.resumed_from) == (4, 3, 3)
    check_stopped_run(run_dir, 3)
    assert written_rows(run_dir) == rows  # kept as they were


@pytest.mark.parametrize("whose", ["another seed", "a step without a checkpoint"])
def test_a_stop_request_not_for_this_runs_committed_step_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whose: str
) -> None:
    """Written while update 3 is recorded: a request identical to one this run would honour
    but for another seed (step 2, its committed row's time), or this run's for step 1, which
    was trained but never checkpointed (its real update time). Training runs to max_steps."""
    run_dir, max_steps = str(tmp_path / "run"), 4

    def request(stamps: dict[int, int]) -> None:
        if whose == "another seed":
            row = wait_for_row(run_dir, 2)
            run = identity(run_dir, max_steps, seed=SEED + 1)
            made = stop_request.StopRequest(run, 2, row.timestamp_ms, reason="test")
        else:
            run = identity(run_dir, max_steps)
            made = stop_request.StopRequest(run, 1, stamps[1], reason="test")
        write_request(run_dir, made)

    act_during_update(monkeypatch, 3, request)
    result = train.train(config(run_dir, max_steps))
    assert os.path.exists(RunLayout(run_dir).stop_request)
    assert result.last_step == max_steps
    check_stopped_run(run_dir, max_steps)
