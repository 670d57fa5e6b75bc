"""The operators that evaluate one checkpoint as a JobSet of the deployment's evaluate job:
`RunJobSetOperator` behind the steps of `tasks.run.stages` (a decided or already evaluated step
creates nothing on the cluster), importing a foreign result when the JobSet succeeded; both as
`tasks.run.evaluate_operator` has every backend do them; a pass deletes the higher steps'
evaluation JobSets still running (`cancel_step_jobset`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from tasks.backends.gke.adapter import cancel_step_jobset, jobset_hook
from tasks.backends.gke.operators import RunJobSetOperator
from tasks.backends.gke.render import render_jobset
from tasks.backends.gke.settings import GkeSettings
from tasks.jobs.templates import EvaluateJob
from tasks.jobs.values import evaluate_values
from tasks.run.evaluate_operator import EvaluateCheckpoint, EvaluateStep, eval_label
from tasks.run.stages import EvalTarget, cancel_above

if TYPE_CHECKING:
    from airflow.sdk import Context

    from rcpflow.records.manifest import ManifestRow
    from tasks.jobs.values import Values


class EvaluateJobSetOperator(EvaluateCheckpoint, RunJobSetOperator):
    """Evaluate the manifest row `row` as a JobSet of `job` (see the module doc)."""

    template_fields = (*RunJobSetOperator.template_fields, "run_dir", "row")
    job_started = "the JobSet was created"
    failure_is_stop = True
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

    def eval_values(self, row: ManifestRow) -> Values:
        return evaluate_values(self.run_dir, row, "python")

    def before_job(self, context: Context, target: EvalTarget) -> None:
        self._target = target

    def after_collect(
        self, context: Context, target: EvalTarget, result: dict[str, Any]
    ) -> dict[str, Any]:
        if result["target_reached"]:
            dag_run = context["dag_run"]
            hook, namespace = jobset_hook(self.cluster), self.settings.namespace

            def cancel(run_dir: str, step: int) -> bool:
                return cancel_step_jobset(hook, namespace, dag_run.dag_id, dag_run.run_id, step)

            cancel_above(target.run_dir, target.step, cancel)
        return result

    def render(self, context: Context) -> dict[str, Any]:
        target = self._target
        dag_run = context["dag_run"]
        return render_jobset(
            self.settings,
            role="evaluate",
            dag_id=dag_run.dag_id,
            run_id=dag_run.run_id,
            job=eval_label(target.step),
            command=self.eval_job.job_command.render(self.eval_values(target.row)),
            image=self.image,
            env=self.env,
            secret_env=self.secret_env,
        )


class EvaluateStepJobSetOperator(EvaluateStep, EvaluateJobSetOperator):
    """`EvaluateJobSetOperator` for the checkpoint of a planned `step` (evaluation during
    training: the step's wait saw its row committed), read from the manifest."""

    template_fields = (*RunJobSetOperator.template_fields, "run_dir", "step")
