"""What ends an evaluate task once its job has ended, on the triggerer (`end_evaluation`, named
``evaluation`` in `tasks.backend_api.task_end.TASK_ENDS`; why there: that module's doc): the
same steps of `tasks.run.stages` as the evaluate operator's resume on a worker
(`tasks.run.evaluate_operator`), from what the operator put in the trigger's kwargs
(`evaluation_end_args`): the checkpoint (its manifest row, or its planned step), the driver
that stops the evaluation of a higher step (its registered name and JSON args, with the DAG
run: `JobDriver.cancel_step`), and the run's retention after the step
(`tasks.run.retention.retention_args`, resolved on the worker: the triggerer loads no
deployment).

- the job did not succeed: skipped when a lower step passed meanwhile (the failure is moot),
  else failed with the job's line, or, for an outcome the backend decides on a worker (a
  restart, a failure without retries), resumed there (None);
- it succeeded: the summary collected and checked (`collect`; an invalid one fails the task),
  a pass stops the higher steps' evaluations (`cancel_above`), retention applies while
  training (`retain_after_evaluation`, never failing the task); success with the collected
  result and the job's record as XComs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow.sdk.exceptions import AirflowSkipException

from tasks.backend_api.lifecycle_names import JOB_RECORD_KEY
from tasks.backend_api.task_end import JobOutcome, TaskEnd, job_record
from tasks.backend_api.watch_trigger import load_driver
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


def step_cancel(cancel: Mapping[str, Any]) -> Callable[[str, int], bool]:
    """`cancel_above`'s canceller: the driver `cancel` names (`evaluation_end_args`)."""
    driver = load_driver(cancel["driver"], cancel["args"])
    dag_id, run_id = str(cancel["dag_id"]), str(cancel["run_id"])
    return lambda run_dir, step: driver.cancel_step(dag_id, run_id, run_dir, step)


def evaluation_end_args(
    ref: Mapping[str, Any],
    run_dir: str,
    *,
    row: Mapping[str, Any] | None,
    step: int,
    cancel: tuple[str, Mapping[str, Any], str, str],
    retention: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The JSON args of `end_evaluation` (see the module doc); `row` None: the planned `step`;
    `cancel`: the driver's name and args, the DAG run's id and run id."""
    return {
        "ref": dict(ref),
        "run_dir": run_dir,
        "row": None if row is None else dict(row),
        "step": step,
        "cancel": {
            "driver": cancel[0],
            "args": dict(cancel[1]),
            "dag_id": cancel[2],
            "run_id": cancel[3],
        },
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
        cancel_above(target.run_dir, target.step, step_cancel(args["cancel"]))
    retain(target.run_dir, target.step, args.get("retention"))
    xcoms = {JOB_RECORD_KEY: job_record(ref, True, "succeeded"), "return_value": result}
    return TaskEnd("success", outcome.line, xcoms)
