"""The GKE backend: jobs as JobSets on TPU slices, created and watched by the operators of
`tasks.backends.gke.operators` and `.evaluate`, through the hooks of `.hooks`."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import get_current_context

from tasks.backend_api.protocol import FormDefaults, register
from tasks.backends.gke.adapter import cancel_step_jobset, jobset_hook
from tasks.backends.gke.groups import evaluate_jobset, evaluate_jobsets, train_jobset_group
from tasks.backends.gke.settings import TABLE, GkeSettings, check_evaluate_job
from tasks.deployment import BackendName, Deployment
from tasks.run.spec import run_dir_of

if TYPE_CHECKING:
    from airflow.sdk import XComArg
    from airflow.sdk.definitions._internal.mixins import DependencyMixin


@register
class GkeBackend:
    """Training as one JobSet group (render -> run, deferred -> cleanup teardown); evaluation
    as one mapped deferrable operator with a cleanup teardown."""

    name: ClassVar[BackendName] = "gke"
    jobs_run_on_worker: ClassVar[bool] = False
    # TPU jobs run the benchmark itself: the closed division's rules.
    form_defaults: ClassVar[FormDefaults] = FormDefaults(division="closed", max_steps=60)

    def __init__(self, deployment: Deployment) -> None:
        settings = deployment.backend_table(TABLE, GkeSettings)
        check_evaluate_job(settings, deployment.jobs.evaluate.command, deployment.source)
        self.deployment = deployment
        self.settings: GkeSettings = settings

    def train_job(self, spec: XComArg) -> DependencyMixin:
        # The JobSet is deleted if the trainer has not ended a grace period after the run's
        # stop request (the trainer reads it from storage); only evaluation during training
        # (a run's Param) writes one.
        return train_jobset_group(
            self.settings,
            self.deployment.jobs.train,
            spec,
            job_timeout=timedelta(minutes=self.deployment.train_timeout_minutes),
            stop_run_dir=run_dir_of(spec),
        )

    def cancel_evaluation(self, run_dir: str, step: int) -> bool:
        """Delete the step's evaluate JobSet of this DAG run if it still runs
        (`cancel_step_jobset`); False when there was none running."""
        context = get_current_context()
        hook = jobset_hook(self.settings.cluster)
        return cancel_step_jobset(
            hook, self.settings.namespace, context["dag"].dag_id, context["run_id"], step
        )

    def _limits(self) -> dict[str, Any]:
        """What bounds every evaluate JobSet: the eval window, its timeout, its retries."""
        d = self.deployment
        return {
            "eval_window": d.eval_window,
            "job_timeout": timedelta(minutes=d.eval_timeout_minutes),
            "retries": d.eval_retries,
        }

    def evaluate(self, run_dir: str | XComArg, rows: XComArg) -> DependencyMixin:
        job = self.deployment.jobs.evaluate
        return evaluate_jobsets(self.settings, job, run_dir, rows, **self._limits())

    def evaluate_checkpoint(self, run_dir: str | XComArg, step: int | XComArg) -> DependencyMixin:
        job = self.deployment.jobs.evaluate
        return evaluate_jobset(self.settings, job, run_dir, step, **self._limits())
