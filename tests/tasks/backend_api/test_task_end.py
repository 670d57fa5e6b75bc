"""Ending a job's task from its trigger (`tasks.backend_api.task_end`): each outcome's state,
line and XComs (the job's record for its teardown), Airflow's end events, the names a trigger's
kwargs may give (never a path), and a function that raises failing the task in one line."""

from __future__ import annotations

import pytest
from airflow.triggers.base import TaskFailedEvent, TaskSkippedEvent, TaskSuccessEvent

from tasks.backend_api import task_end
from tasks.backend_api.lifecycle_names import JOB_RECORD_KEY
from tasks.backend_api.task_end import JobOutcome, TaskEnd, TaskEndSpec, end_job, end_task

REF = {"name": "train seed 1", "pid": 7}


def test_a_job_that_succeeded_or_was_stopped_ends_its_task_in_success_with_its_record() -> None:
    ok = end_job(JobOutcome(REF, "succeeded", "train seed 1: finished"))
    assert ok.state == "success" and ok.line == "train seed 1: finished"
    assert ok.xcoms[JOB_RECORD_KEY] == {**REF, "cancel": False, "why": "succeeded"}
    stopped = end_job(JobOutcome(REF, "stopped", "cancelled"))
    assert stopped.state == "success"
    assert stopped.xcoms[JOB_RECORD_KEY]["cancel"] is True


def test_a_failed_job_fails_its_task_with_the_jobs_line() -> None:
    end = end_job(JobOutcome(REF, "failed", "train seed 1 exited with status 3"))
    assert end.state == "failed" and end.line == "train seed 1 exited with status 3"
    assert end.xcoms[JOB_RECORD_KEY]["why"] == "failed: train seed 1 exited with status 3"
    assert "return_value" not in end.xcoms


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
    assert end.state == "failed"
    assert end.line == "eval: finished; ending the task: OSError: storage gone"
    assert "\n" not in end.line and end.xcoms[JOB_RECORD_KEY]["cancel"] is True
