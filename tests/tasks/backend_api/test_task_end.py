"""Ending a job's task from its trigger (`tasks.backend_api.task_end`): each outcome's state,
line and XComs (the job's record for its teardown), Airflow's end events, the names a trigger's
kwargs may give (never a path), and a function that raises failing the task in one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.triggers.base import TaskFailedEvent, TaskSkippedEvent, TaskSuccessEvent

from tasks.backend_api import task_end
from tasks.backend_api.lifecycle_names import JOB_RECORD_KEY
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


# --- each backend's trigger says how its job ended, and the watch ends the task with it -------


def _slurm(**kwargs: object):
    from tasks.backends.slurm.triggers import SlurmJobTrigger

    job = {"job_id": "7", "name": "rcpflow-eval-18-x", "submit_time": 5}
    contract = {"fail_exit_codes": [2, 5], "signal_grace_s": 30, "time_limit_s": 900}
    return SlurmJobTrigger(connection={}, job=job, **{"contract": contract, **kwargs})  # type: ignore[arg-type]


def _slurm_finished(state: str, code: int | None) -> dict[str, object]:
    from tasks.backends.slurm.hooks import JobInfo
    from tasks.backends.slurm.triggers import FINISHED, event_payload

    info = JobInfo(
        job_id="7", name="rcpflow-eval-18-x", state=state, reason="", exit_code=code,
        signal=None, submit_time=5, start_time=6, end_time=60, restarts=0, stdout_path="",
        nodes="n1", time_limit_s=900, source="squeue",
    )  # fmt: skip
    return event_payload(FINISHED, _slurm().job, {"counted": 0, "uncounted": 0}, info=info)


def test_a_slurm_job_that_completed_succeeds_and_every_other_end_is_the_operators() -> None:
    ok = _slurm().job_outcome(_slurm_finished("COMPLETED", 0))
    assert ok is not None and ok.ended == "succeeded"
    assert ok.line == "Slurm job 7 (rcpflow-eval-18-x) ended: COMPLETED, exit code 0"
    for state, code in (("FAILED", 2), ("FAILED", 1), ("TIMEOUT", None), ("CANCELLED", 0)):
        other = _slurm().job_outcome(_slurm_finished(state, code))
        assert other is not None and other.ended == "other", (state, code)
    # without its contract (an evaluation waiting on the training's allocation) it says nothing
    assert _slurm(contract=None).job_outcome(_slurm_finished("COMPLETED", 0)) is None


def test_a_jobset_that_succeeded_succeeds_and_a_failed_one_is_the_operators() -> None:
    from tasks.backends.gke.settings import GkeSettings
    from tasks.backends.gke.triggers import JobSetTrigger, cluster_kwargs

    cluster = cluster_kwargs(GkeSettings(use_dns_endpoint=True).cluster)
    trigger = JobSetTrigger(name="js", namespace="ns", cluster=cluster, poll_interval_s=1.0)
    base = {"name": "js", "namespace": "ns", "reason": "", "message": "", "progress": "1/1",
            "pods": [], "kwargs": None}  # fmt: skip
    ok = trigger.job_outcome({**base, "phase": "Succeeded"})
    assert (
        ok is not None and ok.ended == "succeeded" and ok.ref == {"name": "js", "namespace": "ns"}
    )
    failed = trigger.job_outcome({**base, "phase": "Failed", "reason": "FailedJobs"})
    assert failed is not None and failed.ended == "other"
    assert trigger.job_outcome({**base, "phase": "watching"}) is None


def test_the_watch_ends_its_task_only_on_a_triggerer() -> None:
    """``dag.test()`` runs a trigger with no task instance: the task resumes with the event."""
    import asyncio

    from airflow.triggers.base import TriggerEvent

    from tasks.backends.local_operators import FINISHED, LocalJobTrigger

    ref = {"name": "train seed 1", "pid": 1, "start": 1, "output": "/x/o", "exit_path": "/x/e"}
    trigger = LocalJobTrigger(job=ref, poll_interval_s=1.0, task_end=TaskEndSpec("job").kwargs())
    event = TriggerEvent(trigger.event(FINISHED, message="finished", exit_code=0))
    assert asyncio.run(trigger.end_of_task(event)) is None
    trigger.task_instance = SimpleNamespace(task_id="train.train_job")  # type: ignore[assignment]
    ended = asyncio.run(trigger.end_of_task(event))
    assert isinstance(ended, TaskSuccessEvent)
    assert ended.xcoms is not None and ended.xcoms[JOB_RECORD_KEY]["why"] == "succeeded"
    failed = TriggerEvent(trigger.event(FINISHED, message="exited with status 3", exit_code=3))
    assert isinstance(asyncio.run(trigger.end_of_task(failed)), TaskFailedEvent)
