"""The one evaluate operator (`EvaluateOperator`), for every driver and both schedules: what a
checkpoint's evaluation does around its job, once: the steps of `tasks.run.stages` (a decided
step starts no job, an evaluated one is reused, a failure after a lower step passed is moot,
the summary is collected and checked), a foreign result taken in through
`tasks.backend_api.foreign_result`, and, once the step passed, the stop of the higher steps'
evaluations still running (the one caller of `cancel_above`; the driver's `cancel_step` stops
one). Its job is run by the one run-job operator it extends (`RunJobOperator`, which holds
the driver). Its step source is a manifest row (`row`, mapped over the rows after training)
or a planned step (`step`, evaluation during training: the step's wait saw its row
committed); with ``[retention] while_training`` the second deletes what its result lets go
before the task ends (`tasks.run.retention.after_evaluation`). It lives in `tasks.run`, not in
`tasks.backend_api` (below it), because it applies the steps of this package."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tasks.backend_api.foreign_result import import_eval_result, record_eval_start
from tasks.backend_api.job_operator import RunJobOperator
from tasks.backend_api.lifecycle_names import STOPPED, WATCHING, eval_label
from tasks.backend_api.task_end import TaskEndSpec
from tasks.backend_api.watch_trigger import WatchTrigger
from tasks.jobs.values import evaluate_values
from tasks.run.evaluation_end import evaluation_end_args
from tasks.run.retention import after_evaluation, retention_args
from tasks.run.stages import (
    EvalTarget,
    cancel_above,
    collect,
    eval_target,
    reusable,
    skip_if_decided,
    step_target,
)

if TYPE_CHECKING:
    from airflow.sdk import Context, XComArg

    from tasks.backend_api.protocol import JobDriver, Submitted
    from tasks.jobs.templates import EvaluateJob

__all__ = ["EvaluateOperator", "eval_label"]


class EvaluateOperator(RunJobOperator):
    """Evaluate one checkpoint of the run in `run_dir` with the job `eval_job` through
    `driver` (see the module doc): the manifest row `row`, or the planned `step`."""

    template_fields = (*RunJobOperator.template_fields, "row", "step")
    # The checkpoint this try evaluates (`target`), set as the task starts or resumes.
    _target: EvalTarget

    def __init__(
        self,
        *,
        driver: JobDriver,
        eval_job: EvaluateJob,
        run_dir: str | XComArg,
        row: Mapping[str, Any] | XComArg | None = None,
        step: int | XComArg | None = None,
        **kwargs: Any,
    ) -> None:
        if (row is None) == (step is None):
            raise ValueError("an evaluate task evaluates a manifest row or a planned step")
        # the job is labelled and filled in execute: its name and command need the checkpoint
        super().__init__(
            driver=driver, role="evaluate", label="", env=driver.job_env(eval_job),
            run_dir=run_dir, **kwargs,
        )  # fmt: skip
        self.eval_job = eval_job
        self.row = row
        self.step = step

    @property
    def planned(self) -> bool:
        """This task evaluates a planned step (evaluation during training)."""
        return self.step is not None

    def target(self) -> EvalTarget:
        """The checkpoint this instance evaluates, as the manifest has it now."""
        run_dir = self.job_run_dir()
        if self.planned:
            return step_target(run_dir, int(str(self.step)))
        if not isinstance(self.row, Mapping):
            raise ValueError(f"row must be a manifest row, got {self.row!r}")
        return eval_target(run_dir, dict(self.row))

    def job_label(self) -> str:
        return eval_label(self._target.step)

    def job_argv(self) -> list[str]:
        values = evaluate_values(self.job_run_dir(), self._target.row, self.driver.python)
        return self.eval_job.job_command.render(values)

    def task_end_spec(self, context: Context, ref: Mapping[str, Any]) -> TaskEndSpec | None:
        """The evaluation's end on the triggerer (`tasks.run.evaluation_end`); None when a
        foreign result is imported (that needs a worker)."""
        if self.eval_job.result.imported:
            return None
        dag_run = context["dag_run"]
        args = evaluation_end_args(
            ref,
            self.job_run_dir(),
            row=self.row if isinstance(self.row, Mapping) else None,
            step=self._target.step,
            cancel=(self.driver.name, self.driver.args(), dag_run.dag_id, dag_run.run_id),
            retention=retention_args(context) if self.planned else None,
        )
        return TaskEndSpec("evaluation", args)

    def execute(self, context: Context) -> Any:
        target = self._target = self.target()
        skip_if_decided(target)
        if reusable(target):
            # This try starts no job: the higher steps' evaluations were stopped by the try
            # that saw this pass first, and a re-evaluation of a decided run (the deferred
            # DAG) must not reach a cluster at all.
            return self.collected(context, target, stop_higher=False)
        blocker = self.driver.waits_for(self.request(context), self.log)
        if blocker is not None:  # e.g. the training evaluates this step in its allocation
            self.log.info("step %d: %s", target.step, blocker.line)
            self.watch(context, blocker, {}, "after_blocker", waiting_only=True)
        if self.eval_job.result.imported:
            values = evaluate_values(self.job_run_dir(), target.row, self.driver.python)
            record_eval_start(context, self.eval_job, values)
        return super().execute(context)

    def after_blocker(self, context: Context, event: Mapping[str, Any]) -> Any:
        """The job this evaluation waited for has ended: look again (a step it evaluated is
        reused, only one it left gets a job)."""
        if event["phase"] == WATCHING:
            self.defer(trigger=WatchTrigger(**event["kwargs"]), method_name="after_blocker")
        if event["phase"] == STOPPED:
            self.log.warning("the job waited for: %s; going on", event["message"])
        return self.execute(context)

    def after_start(self, context: Context, submitted: Submitted) -> None:
        # A lower step that passed before this job's record existed could not stop it: look
        # again now that it can (the pass's `cancel_above` ran before).
        try:
            skip_if_decided(self._target)
        except BaseException:
            self.driver.cancel(submitted.ref)
            raise

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> Any:
        target = self._target = self.target()
        try:
            super().execute_complete(context, event)  # a watching event defers again
            if self.eval_job.result.imported:
                values = evaluate_values(self.job_run_dir(), target.row, self.driver.python)
                started = "the job was started"
                imported = import_eval_result(context, self.eval_job, values, started)
                self.log.info("%s", imported.describe())
        except Exception:
            # a lower step passed meanwhile (and stopped this job): this failure is moot
            skip_if_decided(target, stopped=True)
            raise
        return self.collected(context, target)

    def collected(
        self, context: Context, target: EvalTarget, *, stop_higher: bool = True
    ) -> dict[str, Any]:
        """The step's collected result (the task's return value); with `stop_higher`, a pass
        stops the evaluations of the higher steps of this DAG run still running (rows
        committed since count too); a planned step's retention follows."""
        result = collect(target)
        if result["target_reached"] and stop_higher:
            dag_run = context["dag_run"]

            def cancel(run_dir: str, step: int) -> bool:
                return self.driver.cancel_step(dag_run.dag_id, dag_run.run_id, run_dir, step)

            cancel_above(target.run_dir, target.step, cancel)
        if self.planned:
            after_evaluation(context, target.run_dir, target.step)
        return result
