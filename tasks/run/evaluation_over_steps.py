"""The run DAG's ``evaluation`` group, for either evaluation schedule (`rcpflow.verdict.schedule`).

It maps a task group ``checkpoint`` over the planned steps (``val_start_at..max_steps``) and
starts alongside training. Per step: ``wait`` (on the triggerer, no task process) until the
checkpoint can be evaluated (committed; under ``after_training`` also training halted) and
the run's eval window has room for it, or ends skipped when it never will be or a lower step
already passed; the job nodes' ``evaluate`` (whose pass stops the evaluations of higher steps
still running: `tasks.run.evaluate_operator`, the one caller of `cancel_above`);
``stop_if_decided``: during training, the stop request is written when the summaries decide
the run. (With ``[retention] while_training`` the evaluate task itself deletes what its result
lets go: `tasks.run.retention`.)
``finalize`` and ``check`` follow training and every step.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import Param, TaskGroup, XComArg, task, task_group
from airflow.sdk.definitions.xcom_arg import PlainXComArg

from rcpflow.verdict.stop_request import request_stop
from tasks.names import TRAIN_TASK_ID
from tasks.run.checkpoint_wait import WaitForCheckpointOperator
from tasks.run.evaluation_group import check, finalize
from tasks.run.job_nodes import RCP_VIEW_DOC, JobNodes
from tasks.run.spec import RunSpec, XComValue

if TYPE_CHECKING:
    from airflow.sdk.definitions.param import ParamsDict

    from tasks.deployment import Deployment

log = logging.getLogger(__name__)

TRAIN_GROUP_ID = TRAIN_TASK_ID


@task
def planned_steps(spec: XComValue) -> list[int]:
    """The steps whose checkpoints training will save: val_start_at..max_steps."""
    run = RunSpec.from_dict(spec)
    return list(range(run.effective_val_start_at, run.max_steps + 1))


def nullable_required_params(params: ParamsDict) -> dict[str, Param]:
    """Task-level copies of the DAG's Params that have no default, with a null default: a
    start-from-trigger task's Params are resolved before the run's conf (docs/airflow.md)."""
    copies: dict[str, Param] = {}
    for key in params:
        param = params.get_param(key)
        if not param.has_value:  # no default (or a null one: copying that is harmless)
            schema = dict(param.schema)
            kind = schema.get("type", "string")
            kinds = kind if isinstance(kind, list) else [kind]
            schema["type"] = ["null", *[k for k in kinds if k != "null"]]
            copies[key] = Param(None, **schema)
    return copies


def evaluation_over_steps(
    nodes: JobNodes, deployment: Deployment, spec: XComArg, train: TaskGroup
) -> TaskGroup:
    """TaskGroup ``evaluation`` for the RunSpec dict `spec` resolves to, alongside `train`."""
    if not isinstance(spec, PlainXComArg):
        raise TypeError(f"expected the output of plan_run, got {spec!r}")
    run_dir, seed, schedule = spec["run_dir"], spec["seed"], spec["eval_schedule"]
    wait_timeout = timedelta(minutes=deployment.train_timeout_minutes + 5)

    @task(map_index_template="step {{ task.op_kwargs['step'] }}", doc_md=RCP_VIEW_DOC)
    def stop_if_decided(
        run_dir: XComValue, step: XComValue, schedule: XComValue
    ) -> dict[str, Any] | None:
        """After the evaluation of `step`, during training: write the stop request once the
        summaries decide the run (else nothing). The evaluate task itself stopped the higher
        steps' evaluations if this one passed."""
        if schedule != "during_training":
            return None
        request = request_stop(run_dir)
        if request is None:
            log.info("after step %s the run's verdict is not decided yet: training goes on", step)
            return None
        log.info("verdict decided: %s; stop request in %s", request.reason, run_dir)
        return {"step": request.step, "timestamp_ms": request.timestamp_ms}

    with TaskGroup(group_id="evaluation") as group:
        steps = planned_steps(spec)
        if not isinstance(steps, PlainXComArg):
            raise TypeError(f"expected the output of planned_steps, got {steps!r}")
        # what a wait started on the triggerer reads its step and run from
        plan_task_id, steps_task_id = spec.operator.task_id, steps.operator.task_id
        if group.dag is None:
            raise RuntimeError("the evaluation group must be built inside a DAG")
        wait_params = nullable_required_params(group.dag.params)

        @task_group(group_id="checkpoint")
        def checkpoint(step: int) -> None:
            wait = WaitForCheckpointOperator(
                task_id="wait",
                run_dir=run_dir,
                step=step,
                seed=seed,
                plan_task_id=plan_task_id,
                steps_task_id=steps_task_id,
                train_group_id=TRAIN_GROUP_ID,
                poll_interval_s=deployment.checkpoint_poll_seconds,
                timeout=wait_timeout,
                train_result=deployment.jobs.train.result,
                map_index_template="step {{ task.step }}",
                params=wait_params,
                doc_md=RCP_VIEW_DOC,
            )
            evaluate = nodes.evaluate_checkpoint(run_dir, step)
            stop = stop_if_decided(run_dir=run_dir, step=step, schedule=schedule)
            wait >> evaluate >> stop

        [checkpoint.expand(step=steps), train] >> finalize(run_dir) >> check(run_dir)
    return group
