"""What ends an evaluate task once its job has ended, on the triggerer (`end_evaluation`, named
``evaluation`` in `tasks.backend_api.task_end.TASK_ENDS`; why there: that module's doc): the
same steps of `tasks.run.stages` as the evaluate operator's resume on a worker
(`tasks.run.evaluate_operator`), from what the operator put in the trigger's kwargs
(`evaluation_end_args`): the checkpoint (its manifest row, or its planned step), how the
backend stops the evaluation of a higher step (a name of `STEP_CANCELS` and its JSON args),
and the run's retention after the step (`tasks.run.retention.retention_args`, resolved on the
worker: the triggerer loads no deployment).

- the job did not succeed: skipped when a lower step passed meanwhile (the failure is moot),
  else failed with the job's line, or, for an outcome the backend decides on a worker (a
  restart, a failure without retries), resumed there (None);
- it succeeded: the summary collected and checked (`collect`; an invalid one fails the task),
  a pass stops the higher steps' evaluations (`cancel_above`), retention applies while
  training (`retain_after_evaluation`, never failing the task); success with the collected
  result and the job's record as XComs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from airflow.sdk.exceptions import AirflowSkipException

from tasks.backend_api.lifecycle_names import JOB_RECORD_KEY
from tasks.backend_api.task_end import JobOutcome, TaskEnd, job_record
from tasks.jobs.result import EvaluationError
from tasks.run.retention import retain
from tasks.run.stages import (
    EvalTarget,
    cancel_above,
    collect,
    eval_target,
    skip_if_decided,
    step_target,
)

# How a backend stops the evaluation job of another step of the same DAG run, by the name an
# evaluate task's trigger kwargs give: "module:function", each ``(args, step) -> bool`` (whether
# one was running). Names live in Airflow's database: tests/tasks/backend_api/test_lifecycle.py.
STEP_CANCELS: Mapping[str, str] = {
    "local": "tasks.backends.local_adapter:cancel_step",
    "slurm": "tasks.backends.slurm.triggers:cancel_step",
    "gke": "tasks.backends.gke.adapter:cancel_step",
}


def step_cancel(name: str, args: Mapping[str, Any]) -> Callable[[str, int], bool]:
    """`cancel_above`'s canceller from `STEP_CANCELS[name]` and its `args`."""
    module, _, function = STEP_CANCELS[name].partition(":")
    cancel: Callable[[Mapping[str, Any], int], bool]
    cancel = getattr(importlib.import_module(module), function)
    return lambda run_dir, step: cancel(args, step)


def evaluation_end_args(
    ref: Mapping[str, Any],
    run_dir: str,
    *,
    row: Mapping[str, Any] | None,
    step: int,
    cancel: tuple[str, Mapping[str, Any]],
    retention: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The JSON args of `end_evaluation` (see the module doc); `row` None: the planned `step`."""
    return {
        "ref": dict(ref),
        "run_dir": run_dir,
        "row": None if row is None else dict(row),
        "step": step,
        "cancel": {"name": cancel[0], "args": dict(cancel[1])},
        "retention": None if retention is None else dict(retention),
    }


def _target(args: Mapping[str, Any]) -> EvalTarget:
    if args["row"] is not None:
        return eval_target(args["run_dir"], dict(args["row"]))
    return step_target(args["run_dir"], int(args["step"]))


def end_evaluation(args: Mapping[str, Any], outcome: JobOutcome) -> TaskEnd | None:
    """How an evaluate task ends after its job's `outcome` (the module doc)."""
    ref = outcome.ref
    try:
        target = _target(args)
    except EvaluationError as exc:
        return TaskEnd("failed", str(exc), {JOB_RECORD_KEY: job_record(ref, True, str(exc))})
    if outcome.ended != "succeeded":
        try:
            skip_if_decided(target, stopped=True)
        except AirflowSkipException as skip:
            record = job_record(ref, True, str(skip))
            return TaskEnd("skipped", str(skip), {JOB_RECORD_KEY: record})
        if outcome.ended != "failed":
            return None
        record = job_record(ref, True, f"failed: {outcome.line}")
        return TaskEnd("failed", outcome.line, {JOB_RECORD_KEY: record})
    try:
        result = collect(target)
    except EvaluationError as exc:
        return TaskEnd("failed", str(exc), {JOB_RECORD_KEY: job_record(ref, False, str(exc))})
    if result["target_reached"]:
        cancel = args["cancel"]
        cancel_above(target.run_dir, target.step, step_cancel(cancel["name"], cancel["args"]))
    retain(target.run_dir, target.step, args.get("retention"))
    xcoms = {JOB_RECORD_KEY: job_record(ref, True, "succeeded"), "return_value": result}
    return TaskEnd("success", outcome.line, xcoms)
