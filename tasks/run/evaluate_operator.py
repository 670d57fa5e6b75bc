"""What every cluster backend's evaluate operator does around its job, once: the steps of
`tasks.run.stages` (a decided step starts no job, an evaluated one is reused, a failure after a
lower step passed is moot, the summary is collected and checked) and a foreign result taken in
through `tasks.backend_api.foreign_result`. A backend's evaluate operator puts
`EvaluateCheckpoint` in front of its own job operator (``class X(EvaluateCheckpoint,
RunJobSetOperator)``), and `EvaluateStep` in front of that for the checkpoint of a planned step.
It lives here, not in `tasks.backend_api`, because it applies the steps of this package."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator

from tasks.backend_api.foreign_result import import_eval_result, record_eval_start
from tasks.run.stages import (
    EvalTarget,
    collect,
    eval_target,
    reusable,
    skip_if_decided,
    step_target,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from rcpflow.records.manifest import ManifestRow
    from tasks.jobs.templates import EvaluateJob
    from tasks.jobs.values import Values


def eval_label(step: int) -> str:
    """The job label of `step`'s evaluation in its DAG run (a backend names its job by it)."""
    return f"eval-{step}"


class EvaluateCheckpoint(BaseOperator):
    """Evaluate the manifest row `row` with the job `eval_job` (see the module doc); the
    backend's operator sets both and `run_dir` in its ``__init__``."""

    eval_job: EvaluateJob
    run_dir: str
    row: Mapping[str, Any]
    # How the job started, as an error says it when this task recorded no start.
    job_started: ClassVar[str]
    # Whether a job that failed after a lower step passed is said to be stopped
    # (`skip_if_decided`): on a backend whose pass stops the higher steps' jobs.
    failure_is_stop: ClassVar[bool]

    def target(self) -> EvalTarget:
        """The checkpoint this instance evaluates, as the manifest has it now."""
        return eval_target(self.run_dir, dict(self.row))

    def eval_values(self, row: ManifestRow) -> Values:
        """The evaluate job's values for `row` (`tasks.jobs.values.evaluate_values`)."""
        raise NotImplementedError

    def before_job(self, context: Context, target: EvalTarget) -> None:
        """What the backend does before its job starts (the step is neither decided nor
        evaluated yet)."""

    def after_collect(
        self, context: Context, target: EvalTarget, result: dict[str, Any]
    ) -> dict[str, Any]:
        """What the backend does with the step's collected result; the task's return value."""
        return result

    def execute(self, context: Context) -> Any:
        target = self.target()
        skip_if_decided(target)
        if reusable(target):
            return collect(target)
        self.before_job(context, target)
        if self.eval_job.result.imported:
            record_eval_start(context, self.eval_job, self.eval_values(target.row))
        return super().execute(context)

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> Any:
        target = self.target()
        try:
            # the backend's job operator, after this class in the method order, has it (a
            # watching event defers again)
            super().execute_complete(context, event)  # type: ignore[misc]
            if self.eval_job.result.imported:
                values = self.eval_values(target.row)
                imported = import_eval_result(context, self.eval_job, values, self.job_started)
                self.log.info("%s", imported.describe())
        except Exception:
            # a lower step passed meanwhile: this failure is moot
            skip_if_decided(target, stopped=self.failure_is_stop)
            raise
        return self.after_collect(context, target, collect(target))


class EvaluateStep(EvaluateCheckpoint):
    """`EvaluateCheckpoint` for the checkpoint of a planned `step` (evaluation during
    training: the step's wait saw its row committed), read from the manifest."""

    def __init__(self, *, step: int, **kwargs: Any) -> None:
        super().__init__(row={}, **kwargs)
        self.step = step

    def target(self) -> EvalTarget:
        return step_target(self.run_dir, self.step)
