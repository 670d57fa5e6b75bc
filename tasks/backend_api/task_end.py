"""A job's task ended from its watch trigger, on the triggerer, instead of resumed on a worker.

Why: Airflow 3.3.2 fails a task whose trigger fires before the scheduler has processed the
executor's report that the deferring try ended ("finished with state success, but the task
instance's state attribute is queued": apache/airflow#67287, fixed by #68741 after 3.3.2;
the running-state variant #71580/#72716). A try that is never resumed on a worker cannot meet
it: the trigger yields Airflow's `TaskSuccessEvent` / `TaskSkippedEvent` / `TaskFailedEvent`
(`TaskEnd.event`), the triggerer sets the task's state and pushes its XComs, and the stale
report then finds a task already ended and is ignored. A failed end goes through the task's
retries (Airflow >= 3.3.1). When Airflow ships the fix this stays right; it only saves a
worker start.

How: the operator names what ends its task (`TaskEndSpec`: a name of `TASK_ENDS` and JSON
arguments) in its trigger's kwargs; once the job has ended the trigger calls that function in
a thread (`end_task`), with the job's outcome (`JobOutcome`), and yields its `TaskEnd`; where
the outcome needs a worker (a restart to submit, a failure without retries, a job the watch
cannot follow) the function gives None and the task resumes with the event as before. The
functions are found by name in `TASK_ENDS` (the names live in Airflow's database with the
trigger's kwargs: pinned by `tests/tasks/backend_api/test_lifecycle.py`), never by a path read
from the kwargs. A trigger run outside a triggerer (``dag.test()``, which resumes every
deferred task with its event) has no task instance: there the event resumes the task as
before, and the operator's `execute_complete` decides the same way (`end_job`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from airflow.triggers.base import (
    TaskFailedEvent,
    TaskSkippedEvent,
    TaskSuccessEvent,
    TriggerEvent,
)

from tasks.backend_api.lifecycle_names import JOB_RECORD_KEY, RECORD_DECISION

# How a job ended, in the lifecycle's terms: it succeeded; it failed (a retry of the task may
# run it again); it was cancelled after the run's stop request; anything else, which the run
# operator decides on a worker (a restart, a failure without retries, a job it cannot follow).
JobEnded = Literal["succeeded", "failed", "stopped", "other"]
TaskState = Literal["success", "skipped", "failed"]


@dataclass(frozen=True)
class JobOutcome:
    """The end of the job of `ref` as its watch saw it; `line` says it in one line (a failure's
    reason, naming the job)."""

    ref: Mapping[str, Any]
    ended: JobEnded
    line: str


@dataclass(frozen=True)
class TaskEnd:
    """How the task ends: its state, the line its log says it with, its XComs."""

    state: TaskState
    line: str
    xcoms: Mapping[str, Any] = field(default_factory=dict)

    def event(self) -> TriggerEvent:
        """The Airflow event that ends the task so (its XComs pushed with it)."""
        kinds = {"success": TaskSuccessEvent, "skipped": TaskSkippedEvent}
        return kinds.get(self.state, TaskFailedEvent)(xcoms=dict(self.xcoms) or None)


def job_record(ref: Mapping[str, Any], cancel: bool | None, why: str) -> dict[str, Any]:
    """The job record a run task keeps (`JOB_RECORD_KEY`; what its teardown does with it)."""
    return {**ref, RECORD_DECISION: cancel, "why": why}


def end_job(outcome: JobOutcome) -> TaskEnd | None:
    """The end of a task that runs one job and has nothing to do after it: success when it
    succeeded or was stopped after the run's stop request (what it committed before is what
    the run has), failed with the job's line when it failed; None for any other outcome. Its
    XCom is the job's record (the teardown removes what is left of an ended job)."""
    if outcome.ended == "other":
        return None
    if outcome.ended == "succeeded":
        record = job_record(outcome.ref, True, "succeeded")
    elif outcome.ended == "stopped":
        record = job_record(outcome.ref, True, "stopped after the run's stop request")
    else:
        record = job_record(outcome.ref, True, f"failed: {outcome.line}")
        return TaskEnd("failed", outcome.line, {JOB_RECORD_KEY: record})
    return TaskEnd("success", outcome.line, {JOB_RECORD_KEY: record, "return_value": record})


def _end_job(args: Mapping[str, Any], outcome: JobOutcome) -> TaskEnd | None:
    return end_job(outcome)


# What may end a task from its trigger, by the name its kwargs give: "module:function", each
# ``(args, outcome) -> TaskEnd``. The evaluation's is in `tasks.run` (it applies the run's steps),
# imported by name so that this package does not import the one above it.
TASK_ENDS: Mapping[str, str] = {
    "job": f"{__name__}:_end_job",
    "evaluation": "tasks.run.evaluation_end:end_evaluation",
}


@dataclass(frozen=True)
class TaskEndSpec:
    """What ends a task from its trigger: `name` (of `TASK_ENDS`) and its JSON `args`."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)

    def kwargs(self) -> dict[str, Any]:
        """As a trigger's kwarg (`from_kwargs` is the inverse)."""
        return {"name": self.name, "args": dict(self.args)}

    @classmethod
    def from_kwargs(cls, value: Mapping[str, Any] | None) -> TaskEndSpec | None:
        if value is None:
            return None
        return cls(str(value["name"]), dict(value.get("args") or {}))


def task_end_function(name: str) -> Callable[[Mapping[str, Any], JobOutcome], TaskEnd | None]:
    """The function `TASK_ENDS` names `name`; KeyError for any other name."""
    module, _, function = TASK_ENDS[name].partition(":")
    found: Callable[[Mapping[str, Any], JobOutcome], TaskEnd | None]
    found = getattr(importlib.import_module(module), function)
    return found


def end_task(spec: TaskEndSpec, outcome: JobOutcome) -> TaskEnd | None:
    """How the task of `spec` ends after `outcome` (synchronous: a trigger calls it in a
    thread); None: it resumes on a worker. Anything it raises fails the task with that one line
    (its retries apply)."""
    try:
        return task_end_function(spec.name)(spec.args, outcome)
    except Exception as exc:
        line = f"{outcome.line}; ending the task: {type(exc).__name__}: {exc}"
        return TaskEnd("failed", line, {JOB_RECORD_KEY: job_record(outcome.ref, True, line)})
