"""The stop request: written only once the persisted summaries decide the run, whatever the
order the evaluations finish in; idempotent; ignored by a trainer of another run; honoured by
the recorder only for a checkpoint it committed. Also where training stands for a planned step
(`rcpflow.records.checkpoint_state`), which the during-training wait reads."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devtools.synthetic_run import T0, make_run, rows_of, write_eval
from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.records.checkpoint_state import ProgressError, run_snapshot
from rcpflow.records.mllog import read_events, run_start_ms
from rcpflow.trainer.recorder import TrainingRecorder
from rcpflow.verdict import stop_request
from rcpflow.verdict.stop_request import RunIdentity, StopRequest, request_stop

VAL_START, MAX_STEPS = 18, 24
STEPS = list(range(VAL_START, MAX_STEPS + 1))
# What an evaluation of a step leaves: a pass, a result below target, or an invalid summary
# (its samples_count disagrees with the manifest row: never a pass, never "evaluated").
OUTCOMES = st.sampled_from(["pass", "below", "invalid"])


def recorder(run_dir: str) -> TrainingRecorder:
    hp = recipe.hyperparameters("closed", 256, MAX_STEPS)
    return TrainingRecorder(run_dir, seed=1, hyperparameters=hp, val_start_at=VAL_START)


def recorder_at_step_19(run_dir: str) -> TrainingRecorder:
    """A recorder that has run 19 updates and committed step 18's checkpoint only."""
    rec = recorder(run_dir)
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    for step in range(1, 20):
        rec.on_update(step, timestamp_ms=T0 + 60_000 + step * 1_000)
    rec.on_checkpoint_committed(18, checkpoint(run_dir, 18))
    return rec


def checkpoint(run_dir: str, step: int) -> str:
    path = Path(run_dir) / "checkpoints" / str(step)
    path.mkdir(parents=True, exist_ok=True)
    (path / "weights.bin").write_bytes(b"w" * step)
    return str(path)


def expected_stop_step(done: dict[int, str]) -> int | None:
    """The rule, stated independently: walk the steps up; a step not validly evaluated first
    decides nothing; the first pass after only valid results below decides the run."""
    for step in STEPS:
        outcome = done.get(step)
        if outcome is None or outcome == "invalid":
            return None
        if outcome == "pass":
            return step
    return None


def write_invalid(run, step: int) -> None:
    """A passing summary whose samples_count disagrees with the manifest row."""
    write_eval(run, step, 0.9)
    path = Path(run.layout.summary(step))
    summary = json.loads(path.read_text())
    summary["samples_count"] += 1
    path.write_text(json.dumps(summary))


def evaluate(run, step: int, outcome: str) -> None:
    if outcome == "invalid":
        write_invalid(run, step)
    else:
        write_eval(run, step, 0.8 if outcome == "pass" else 0.4)


@settings(max_examples=25, deadline=None)
@given(
    outcomes=st.fixed_dictionaries({s: OUTCOMES for s in STEPS}),
    order=st.permutations(STEPS),
    cut=st.integers(min_value=0, max_value=len(STEPS)),
)
def test_never_written_before_the_verdict_is_decided(
    outcomes: dict[int, str], order: list[int], cut: int
) -> None:
    """Evaluations finish in any order (an eval window > 1, retries); after each one the DAG
    asks for a stop. The request exists exactly when the summaries decide success, names the
    first passing step with its weight-update time, and never changes once written."""
    with tempfile.TemporaryDirectory() as tmp:
        run = make_run(f"{tmp}/run", max_steps=MAX_STEPS)
        done: dict[int, str] = {}
        written: bytes | None = None
        for step in order[:cut]:
            evaluate(run, step, outcomes[step])
            done[step] = outcomes[step]
            request = request_stop(run.run_dir)
            want = expected_stop_step(done)
            path = Path(run.layout.stop_request)
            if want is None:
                assert request is None and not path.exists(), (done, request)
                continue
            assert request is not None and request.step == want
            assert request.timestamp_ms == run.row(want).timestamp_ms
            if written is not None:
                assert path.read_bytes() == written  # once decided, it stays as written
            written = path.read_bytes()


def test_idempotent_and_names_the_run(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), accuracies={18: 0.4, 19: 0.8})
    first = request_stop(run.run_dir)
    data = Path(run.layout.stop_request).read_bytes()
    again = request_stop(run.run_dir)
    assert first == again
    assert Path(run.layout.stop_request).read_bytes() == data
    assert first is not None
    start = run_start_ms(read_events(run.layout.mllog(1)))
    assert first.run == RunIdentity(1, 256, VAL_START, 24, start)
    assert first.step == 19


def test_another_runs_request_is_ignored_and_replaced(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), accuracies={18: 0.8})
    ours = RunIdentity(1, 256, VAL_START, 24, T0 + 60_000)
    other = StopRequest(
        run=RunIdentity(1, 256, VAL_START, 24, T0 - 5),  # an earlier run in the same folder
        step=18,
        timestamp_ms=run.row(18).timestamp_ms,
        reason="old",
    )
    Path(run.layout.stop_request).write_bytes(other.to_json())
    assert stop_request.for_run(run.run_dir, ours) is None
    assert stop_request.for_run(run.run_dir, other.run) == other
    written = request_stop(run.run_dir)
    assert written is not None and written.run == ours
    assert stop_request.for_run(run.run_dir, ours) == written


@pytest.mark.parametrize(
    "format_id", ["rcpflow.stop_request.v1", "rcpflow.verdict.stop_request.v1"]
)
def test_a_request_in_either_format_id_is_a_stop(tmp_path: Path, format_id: str) -> None:
    """The id written before the module move (an orchestrator of an older release) and the one
    written now are both read, and what is written is the one the previous release reads."""
    run = make_run(str(tmp_path / "run"), accuracies={18: 0.4, 19: 0.8})
    written = request_stop(run.run_dir)
    assert written is not None
    path = Path(run.layout.stop_request)
    assert json.loads(path.read_bytes())["format"] == "rcpflow.verdict.stop_request.v1"
    path.write_text(json.dumps({**json.loads(path.read_bytes()), "format": format_id}))
    assert stop_request.for_run(run.run_dir, written.run) == written
    assert stop_request.current(run.run_dir) == written


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b'{"format": "other"}', b'{"format": "rcpflow.verdict.stop_request.v1"}'],
)
def test_a_malformed_request_is_never_a_stop(tmp_path: Path, content: bytes) -> None:
    run = make_run(str(tmp_path / "run"))
    Path(run.layout.stop_request).write_bytes(content)
    ours = RunIdentity(1, 256, VAL_START, 24, T0 + 60_000)
    assert stop_request.for_run(run.run_dir, ours) is None
    with pytest.raises(stop_request.StopRequestError, match=r"stop_request\.json"):
        stop_request.read(run.run_dir)


def test_no_request_without_a_decision(tmp_path: Path) -> None:
    # 19 passes but 18 has no summary; then 18 failed to evaluate (invalid): still undecided
    run = make_run(str(tmp_path / "run"), accuracies={19: 0.9})
    assert request_stop(run.run_dir) is None
    write_invalid(run, 18)
    assert request_stop(run.run_dir) is None
    assert not Path(run.layout.stop_request).exists()


def test_honoured_by_explains_an_early_end(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), last_step=21, accuracies={18: 0.3, 19: 0.8})
    rows = rows_of(run.run_dir)
    assert stop_request.honoured_by(run.run_dir, rows) is None
    request_stop(run.run_dir)
    honoured = stop_request.honoured_by(run.run_dir, rows)
    assert honoured is not None and honoured.step == 19


def test_the_recorder_honours_only_a_request_for_a_committed_checkpoint(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    rec = recorder_at_step_19(run_dir)
    assert not rec.stop_requested()  # no request
    identity = RunIdentity(1, 256, VAL_START, 24, T0 + 30_000)
    layout = RunLayout(run_dir)

    def ask(step: int, run: RunIdentity = identity) -> None:
        ts = T0 + 60_000 + step * 1_000
        Path(layout.stop_request).write_bytes(StopRequest(run, step, ts, "test").to_json())

    ask(19)
    assert not rec.stop_requested()  # step 19 is not committed yet: its row must come first
    rec.on_checkpoint_committed(19, checkpoint(run_dir, 19))
    assert rec.stop_requested()
    ask(19, RunIdentity(2, 256, VAL_START, 24, T0 + 30_000))  # another seed's run
    assert not rec.stop_requested()
    ask(19, RunIdentity(1, 256, VAL_START, 24, T0 + 29_999))  # another attempt's run_start
    assert not rec.stop_requested()
    ask(18)
    assert rec.stop_requested()
    rec.on_train_end()
    events = read_events(layout.mllog(1))
    (stop,) = [e for e in events if e.key == "block_stop"]
    assert stop.time_ms == T0 + 60_000 + 19 * 1_000  # backdated to the last update


def test_progress_of_a_planned_step(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    assert run_snapshot(run_dir, seed=1).progress(18).state == "pending"  # nothing yet
    rec = recorder_at_step_19(run_dir)
    committed = run_snapshot(run_dir, seed=1).progress(18)
    assert committed.state == "committed" and committed.row is not None
    assert committed.row.step == 18
    assert run_snapshot(run_dir, seed=1).progress(19).state == "pending"
    rec.on_checkpoint_committed(19, checkpoint(run_dir, 19))
    rec.on_train_end()  # stopped at step 19 of 24
    assert run_snapshot(run_dir, seed=1).progress(19).state == "committed"
    ended = run_snapshot(run_dir, seed=1).progress(20)
    assert ended.state == "ended"
    assert "block_stop at step 19" in ended.detail
    Path(RunLayout(run_dir).manifest).write_text("not a row\n")
    with pytest.raises(ProgressError, match="manifest"):
        run_snapshot(run_dir, seed=1).progress(20)


def test_an_earlier_attempts_block_stop_is_not_the_end(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), last_step=19)
    log = Path(run.layout.mllog(1))
    # a new attempt started after the old block_stop (a later run_start): not ended
    later = max(e.time_ms for e in read_events(str(log))) + 1
    event = {"namespace": "", "time_ms": later, "event_type": "INTERVAL_START",
             "key": "run_start", "value": None, "metadata": {}}  # fmt: skip
    line = f":::MLLOG {json.dumps(event)}\n"
    log.write_text(log.read_text() + line)
    assert run_snapshot(run.run_dir, seed=1).progress(20).state == "pending"
