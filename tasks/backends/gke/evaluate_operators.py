"""The evaluate operator of the GKE backend: `tasks.run.evaluate_operator.EvaluateCheckpoint`
(the steps of `tasks.run.stages`, a foreign result, the stop of the higher steps after a pass)
in front of `RunJobSetOperator`, the JobSet rendered for the checkpoint; a higher step's
evaluation is stopped by deleting its JobSet (`adapter.cancel_step_jobset`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tasks.backends.gke.adapter import cancel_step_jobset, jobset_hook, step_cancel_args
from tasks.backends.gke.operators import RunJobSetOperator
from tasks.backends.gke.render import render_jobset
from tasks.jobs.templates import EvaluateJob
from tasks.run.evaluate_operator import EvaluateCheckpoint, EvaluateStep

if TYPE_CHECKING:
    from airflow.sdk import Context


class EvaluateJobSetOperator(EvaluateCheckpoint, RunJobSetOperator):
    """Evaluate the manifest row `row` as a JobSet of `eval_job` (see the module doc); `job_timeout`
    bounds its running time."""

    template_fields = (*RunJobSetOperator.template_fields, "run_dir", "row")
    job_started = "the JobSet was created"

    @staticmethod
    def job_kwargs(eval_job: EvaluateJob) -> dict[str, Any]:
        return {"command": (), "image": eval_job.image, "env": eval_job.env,
                "secret_env": eval_job.secret_env}  # fmt: skip

    def cancel_step(self, dag_id: str, run_id: str, step: int) -> bool:
        hook = jobset_hook(self.cluster)
        return cancel_step_jobset(hook, self.settings.namespace, dag_id, run_id, step)

    def step_cancel(self, dag_id: str, run_id: str) -> tuple[str, dict[str, Any]]:
        return "gke", step_cancel_args(self.cluster, self.settings.namespace, dag_id, run_id)

    def render(self, context: Context) -> dict[str, Any]:
        dag_run = context["dag_run"]
        return render_jobset(
            self.settings, role="evaluate", dag_id=dag_run.dag_id, run_id=dag_run.run_id,
            job=self.eval_label(), command=self.eval_argv(), image=self.image, env=self.env,
            secret_env=self.secret_env,
        )  # fmt: skip


class EvaluateStepJobSetOperator(EvaluateStep, EvaluateJobSetOperator):
    """`EvaluateJobSetOperator` for the checkpoint of a planned `step` (evaluation during
    training: the step's wait saw its row committed), read from the manifest."""

    template_fields = (*RunJobSetOperator.template_fields, "run_dir", "step")
