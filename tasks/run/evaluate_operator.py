"""The evaluate operator every cluster backend uses: what it does around its job, once: the
steps of `tasks.run.stages` (a decided step starts no job, an evaluated one is reused, a failure
after a lower step passed is moot, the summary is collected and checked), a foreign result taken
in through `tasks.backend_api.foreign_result`, and, once the step passed, the stop of the higher
steps' evaluations still running: the one caller of `cancel_above` (the backend's `cancel_step`
stops one). A backend's evaluate operator puts `EvaluateCheckpoint` in front of its own job
operator (``class X(EvaluateCheckpoint, RunJobSetOperator)``), and `EvaluateStep` in front of
that for the checkpoint of a planned step. It lives here, not in `tasks.backend_api` (below
`tasks.run`), because it applies the steps of this package."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator

from tasks.backend_api.foreign_result import import_eval_result, record_eval_start
from tasks.backend_api.lifecycle_names import eval_label
from tasks.backend_api.task_end import TaskEndSpec
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
    from airflow.sdk import Context

    from tasks.jobs.templates import EvaluateJob

__all__ = ["EvaluateCheckpoint", "EvaluateStep", "eval_label"]


class EvaluateCheckpoint(BaseOperator):
    """Evaluate the manifest row `row` of the run in `run_dir` with the job `eval_job` (see the
    module doc); the backend's operator supplies `job_kwargs` and `cancel_step`."""

    eval_job: EvaluateJob
    run_dir: str
    row: Mapping[str, Any]
    # How the job started, as an error says it when this task recorded no start.
    job_started: ClassVar[str]
    # The checkpoint this try evaluates (`target`), set as the task starts or resumes.
    _target: EvalTarget

    def __init__(
        self, *, eval_job: EvaluateJob, run_dir: str, row: Mapping[str, Any], **kwargs: Any
    ) -> None:
        # the job is rendered in execute: its name and command need the row
        super().__init__(role="evaluate", job="", **self.job_kwargs(eval_job), **kwargs)
        self.eval_job = eval_job
        self.run_dir = run_dir
        self.row = row

    @staticmethod
    def job_kwargs(eval_job: EvaluateJob) -> dict[str, Any]:
        """What the backend's job operator takes of the evaluate job (its env, an image)."""
        raise NotImplementedError

    def target(self) -> EvalTarget:
        """The checkpoint this instance evaluates, as the manifest has it now."""
        return eval_target(self.run_dir, dict(self.row))

    def eval_python(self) -> str:
        """The evaluate job's ``{python}`` (`tasks.jobs.values.evaluate_values`)."""
        return "python"

    def eval_argv(self) -> list[str]:
        """The evaluate job's argument list for this try's checkpoint."""
        values = evaluate_values(self.run_dir, self._target.row, self.eval_python())
        return self.eval_job.job_command.render(values)

    def eval_label(self) -> str:
        """The label the backend names this checkpoint's job by (`eval_label`)."""
        return eval_label(self._target.step)

    def before_job(self, context: Context, target: EvalTarget) -> None:
        """What the backend does before its job starts (the step is neither decided nor
        evaluated yet)."""

    def cancel_step(self, dag_id: str, run_id: str, step: int) -> bool:
        """Stop the evaluation job of `step` in that DAG run if one runs; whether one did."""
        raise NotImplementedError

    def step_cancel(self, dag_id: str, run_id: str) -> tuple[str, dict[str, Any]] | None:
        """`cancel_step` for the triggerer: a name of `tasks.run.evaluation_end.STEP_CANCELS`
        and its JSON args; None: this backend's evaluate tasks resume on a worker."""
        return None

    def task_end_spec(self, context: Context, ref: Mapping[str, Any]) -> TaskEndSpec | None:
        """The evaluation's end on the triggerer (`tasks.run.evaluation_end`); None when a
        foreign result is imported (that needs a worker) or the backend has no `step_cancel`."""
        dag_run = context["dag_run"]
        cancel = self.step_cancel(dag_run.dag_id, dag_run.run_id)
        if self.eval_job.result.imported or cancel is None:
            return None
        args = evaluation_end_args(
            ref,
            self.run_dir,
            row=self.end_row(),
            step=self._target.step,
            cancel=cancel,
            retention=self.end_retention(context),
        )
        return TaskEndSpec("evaluation", args)

    def end_row(self) -> Mapping[str, Any] | None:
        """The manifest row the end re-reads and compares (None: the planned step's row)."""
        return dict(self.row)

    def end_retention(self, context: Context) -> dict[str, Any] | None:
        """What retention applies after the evaluation (`retention_args`): none here."""
        return None

    def execute(self, context: Context) -> Any:
        target = self._target = self.target()
        skip_if_decided(target)
        if reusable(target):
            # This try starts no job: the higher steps' evaluations were stopped by the try
            # that saw this pass first, and a re-evaluation of a decided run (the deferred
            # DAG) must not reach a cluster at all.
            return self.collected(context, target, stop_higher=False)
        self.before_job(context, target)
        if self.eval_job.result.imported:
            values = evaluate_values(self.run_dir, target.row, self.eval_python())
            record_eval_start(context, self.eval_job, values)
        return super().execute(context)

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> Any:
        target = self._target = self.target()
        try:
            # the backend's job operator, after this class in the method order, has it (a
            # watching event defers again)
            super().execute_complete(context, event)  # type: ignore[misc]
            if self.eval_job.result.imported:
                values = evaluate_values(self.run_dir, target.row, self.eval_python())
                imported = import_eval_result(context, self.eval_job, values, self.job_started)
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
        committed since count too)."""
        result = collect(target)
        if result["target_reached"] and stop_higher:
            dag_run = context["dag_run"]

            def cancel(run_dir: str, step: int) -> bool:
                return self.cancel_step(dag_run.dag_id, dag_run.run_id, step)

            cancel_above(target.run_dir, target.step, cancel)
        return result


class EvaluateStep(EvaluateCheckpoint):
    """`EvaluateCheckpoint` for the checkpoint of a planned `step` (evaluation during
    training: the step's wait saw its row committed), read from the manifest. With ``[retention]
    while_training``, what the collected result lets go is deleted before the task ends, so
    before the step's slot in the eval window frees (`tasks.run.retention.after_evaluation`)."""

    def __init__(self, *, step: int, **kwargs: Any) -> None:
        super().__init__(row={}, **kwargs)
        self.step = step

    def target(self) -> EvalTarget:
        return step_target(self.run_dir, self.step)

    def end_row(self) -> Mapping[str, Any] | None:
        return None

    def end_retention(self, context: Context) -> dict[str, Any] | None:
        return retention_args(context)

    def collected(
        self, context: Context, target: EvalTarget, *, stop_higher: bool = True
    ) -> dict[str, Any]:
        result = super().collected(context, target, stop_higher=stop_higher)
        after_evaluation(context, self.run_dir, self.step)
        return result
