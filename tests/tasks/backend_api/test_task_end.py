"""Ending a job's task from its trigger (`tasks.backend_api.task_end`): each outcome's state,
line and XComs (the job's record for its teardown), Airflow's end events, the names a trigger's
kwargs may give (never a path), and a function that raises failing the task in one line."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from airflow.triggers.base import TaskFailedEvent, TaskSkippedEvent, TaskSuccessEvent

from tasks.backend_api import task_end
from tasks.backend_api.lifecycle_names import ENDED, JOB_RECORD_KEY, STOPPED, WATCHING
from tasks.backend_api.task_end import JobOutcome, TaskEnd, TaskEndSpec, end_job, end_task

REF = {"name": "train seed 1", "pid": 7}


def test_a_job_that_succeeded_or_was_stopped_ends_its_task_in_success_with_its_record() -> None:
    ok = end_job(JobOutcome(REF, "succeeded", "train seed 1: finished"))
    assert ok is not None and ok.state == "success" and ok.line == "train seed 1: finished"
    # the teardown removes what is left of an ended job (a finished JobSet object)
    assert ok.xcoms[JOB_RECORD_KEY] == {**REF, "cancel": True, "why": "succeeded"}
    stopped = end_job(JobOutcome(REF, "stopped", "cancelled"))
    assert stopped is not None and stopped.state == "success"
    assert stopped.xcoms[JOB_RECORD_KEY]["cancel"] is True


def test_a_failed_job_fails_its_task_with_the_jobs_line() -> None:
    end = end_job(JobOutcome(REF, "failed", "train seed 1 exited with status 3"))
    assert end is not None
    assert end.state == "failed" and end.line == "train seed 1 exited with status 3"
    assert end.xcoms[JOB_RECORD_KEY]["why"] == "failed: train seed 1 exited with status 3"
    assert "return_value" not in end.xcoms


def test_an_outcome_the_backend_decides_on_a_worker_resumes_the_task() -> None:
    """A restart to submit, a failure without retries, a watch error: no end on the triggerer."""
    assert end_job(JobOutcome(REF, "other", "Slurm job 7 ended: TIMEOUT")) is None
    assert end_task(TaskEndSpec("job"), JobOutcome(REF, "other", "x")) is None


def test_each_end_is_airflows_event_with_its_xcoms() -> None:
    success = TaskEnd("success", "ok", {"return_value": 1}).event()
    assert isinstance(success, TaskSuccessEvent) and success.xcoms == {"return_value": 1}
    assert isinstance(TaskEnd("skipped", "moot").event(), TaskSkippedEvent)
    failed = TaskEnd("failed", "bad").event()
    assert isinstance(failed, TaskFailedEvent) and failed.xcoms is None


def test_the_names_a_trigger_may_give_are_pinned_and_resolve() -> None:
    """Airflow's database keeps them with a deferred task's trigger kwargs."""
    assert dict(task_end.TASK_ENDS) == {
        "job": "tasks.backend_api.task_end:_end_job",
        "evaluation": "tasks.run.evaluation_end:end_evaluation",
    }
    for name in task_end.TASK_ENDS:
        assert callable(task_end.task_end_function(name))
    with pytest.raises(KeyError):
        task_end.task_end_function("os:system")
    spec = TaskEndSpec("job", {"a": 1})
    assert TaskEndSpec.from_kwargs(spec.kwargs()) == spec
    assert TaskEndSpec.from_kwargs(None) is None


def test_an_end_that_raises_fails_the_task_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(args: object, outcome: JobOutcome) -> TaskEnd:
        raise OSError("storage gone")

    monkeypatch.setattr(task_end, "task_end_function", lambda name: broken)
    end = end_task(TaskEndSpec("job"), JobOutcome(REF, "succeeded", "eval: finished"))
    assert end is not None and end.state == "failed"
    assert end.line == "eval: finished; ending the task: OSError: storage gone"
    assert "\n" not in end.line and end.xcoms[JOB_RECORD_KEY]["cancel"] is True


# --- the one watch says how its job ended, and ends the task with it --------------------------


def _trigger(**kwargs: Any) -> Any:
    from tasks.backend_api.watch_trigger import WatchTrigger

    ref = {"name": "train", "pid": 1, "start": 1, "output": "/x/o", "exit_path": "/x/e"}
    args = {"jobs_root": "/nonexistent"}
    return WatchTrigger(driver="local", driver_args=args, ref=ref, poll_interval_s=1.0, **kwargs)


def _ended(outcome: str, line: str = "exited with status 0") -> dict[str, Any]:
    from tasks.backend_api.job_state import JobState

    state = JobState(line, outcome, 0)  # type: ignore[arg-type]
    return dict(_trigger().event(ENDED, state=state))


@pytest.mark.parametrize(
    ("outcome", "ended"),
    [
        ("succeeded", "succeeded"),
        ("failed", "failed"),
        # a restart to submit, a failure without retries, a job left or not ours: a worker's
        ("restart", "other"),
        ("restart_uncounted", "other"),
        ("fail_now", "other"),
        ("cancelled", "other"),
        ("lost", "other"),
        ("foreign", "other"),
    ],
)
def test_every_drivers_outcome_maps_to_one_end(outcome: str, ended: str) -> None:
    found = _trigger().job_outcome(_ended(outcome))
    assert found is not None and found.ended == ended
    assert found.line == "train: exited with status 0"  # the driver's line, naming the job


def test_a_stop_ends_as_stopped_and_a_watching_event_resumes() -> None:
    trigger = _trigger()
    stopped = trigger.job_outcome(trigger.event(STOPPED, message="still running 600 s after"))
    assert stopped is not None and stopped.ended == "stopped"
    assert trigger.job_outcome(trigger.event(WATCHING)) is None


def test_the_watch_ends_its_task_only_on_a_triggerer() -> None:
    """``dag.test()`` runs a trigger with no task instance: the task resumes with the event."""
    import asyncio

    from airflow.triggers.base import TriggerEvent

    trigger = _trigger(task_end=TaskEndSpec("job").kwargs())
    event = TriggerEvent(_ended("succeeded"))
    assert asyncio.run(trigger.end_of_task(event)) is None
    trigger.task_instance = SimpleNamespace(task_id="train.job.run")
    ended = asyncio.run(trigger.end_of_task(event))
    assert isinstance(ended, TaskSuccessEvent)
    assert ended.xcoms is not None and ended.xcoms[JOB_RECORD_KEY]["why"] == "succeeded"
    failed = TriggerEvent(_ended("failed", "exited with status 3"))
    assert isinstance(asyncio.run(trigger.end_of_task(failed)), TaskFailedEvent)
    restart = TriggerEvent(_ended("restart", "preempted"))
    assert asyncio.run(trigger.end_of_task(restart)) is None  # the operator restarts it
