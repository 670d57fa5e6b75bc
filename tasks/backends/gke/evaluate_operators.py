"""The operators that evaluate one checkpoint as a JobSet of the deployment's evaluate job:
`RunJobSetOperator` behind the steps of `tasks.run.stages` (a decided or already evaluated step
creates nothing on the cluster), importing a foreign result when the JobSet succeeded
(`tasks.jobs.result`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from tasks.backends.gke.operators import RunJobSetOperator
from tasks.backends.gke.render import render_jobset
from tasks.backends.gke.settings import GkeSettings
from tasks.jobs.result import Baseline, EvaluationError, baseline, import_result, now_ms
from tasks.jobs.templates import EvaluateJob
from tasks.jobs.values import evaluate_values
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

# XCom key of a foreign evaluate job's start: its wall clock and what was at its result path
# (read back when the deferred task resumes, in another process).
EVAL_START_XCOM_KEY = "eval_start"


class EvaluateJobSetOperator(RunJobSetOperator):
    """Evaluate the manifest row `row` as a JobSet of `job` (see the module doc)."""

    template_fields = (*RunJobSetOperator.template_fields, "run_dir", "row")
    _target: EvalTarget

    def __init__(
        self,
        *,
        settings: GkeSettings,
        job: EvaluateJob,
        run_dir: str,
        row: Mapping[str, Any],
        job_timeout: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        # the JobSet is rendered in execute (`render`): its name and command need the row
        super().__init__(
            settings=settings,
            role="evaluate",
            job="",
            command=(),
            image=job.image,
            env=job.env,
            secret_env=job.secret_env,
            job_timeout=job_timeout,
            **kwargs,
        )
        self.eval_job = job
        self.run_dir = run_dir
        self.row = row

    def target(self) -> EvalTarget:
        """The checkpoint this instance evaluates, as the manifest has it now."""
        return eval_target(self.run_dir, dict(self.row))

    def execute(self, context: Context) -> Any:
        target = self.target()
        skip_if_decided(target)
        if reusable(target):
            return collect(target)
        self._target = target
        if self.eval_job.result.imported:
            values = evaluate_values(self.run_dir, target.row, "python")
            before = baseline(self.eval_job.result, values)
            context["ti"].xcom_push(
                key=EVAL_START_XCOM_KEY, value={"ms": now_ms(), "baseline": before.to_dict()}
            )
        return super().execute(context)

    def render(self, context: Context) -> dict[str, Any]:
        target = self._target
        dag_run = context["dag_run"]
        return render_jobset(
            self.settings,
            role="evaluate",
            dag_id=dag_run.dag_id,
            run_id=dag_run.run_id,
            job=f"eval-{target.step}",
            command=self.eval_job.job_command.render(
                evaluate_values(self.run_dir, target.row, "python")
            ),
            image=self.image,
            env=self.env,
            secret_env=self.secret_env,
        )

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> Any:
        target = self.target()
        try:
            super().execute_complete(context, event)  # a Watching event defers again
            if self.eval_job.result.imported:
                self._import_result(context, target.row)
        except Exception:
            skip_if_decided(target)  # a lower step passed meanwhile: this failure is moot
            raise
        return collect(target)

    def _import_result(self, context: Context, row: ManifestRow) -> None:
        """The foreign result of the JobSet that just succeeded, with the wall clock from just
        before its creation to now as the eval times (`tasks.jobs.result`)."""
        ti = context["ti"]
        start = ti.xcom_pull(task_ids=ti.task_id, key=EVAL_START_XCOM_KEY, map_indexes=ti.map_index)
        if start is None:
            raise EvaluationError(
                f"step {row.step}: no {EVAL_START_XCOM_KEY} recorded before the JobSet was "
                "created: its eval times are unknown; clear the task to evaluate again"
            )
        imported = import_result(
            self.eval_job.result,
            evaluate_values(self.run_dir, row, "python"),
            Baseline.from_dict(start["baseline"]),
            (start["ms"], now_ms()),
        )
        self.log.info("%s", imported.describe())


class EvaluateStepJobSetOperator(EvaluateJobSetOperator):
    """`EvaluateJobSetOperator` for the checkpoint of a planned `step` (evaluation during
    training: the step's wait saw its row committed), read from the manifest."""

    template_fields = (*RunJobSetOperator.template_fields, "run_dir", "step")

    def __init__(self, *, step: int, **kwargs: Any) -> None:
        super().__init__(row={}, **kwargs)
        self.step = step

    def target(self) -> EvalTarget:
        return step_target(self.run_dir, self.step)
