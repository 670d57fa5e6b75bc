"""The GKE backend: jobs as JobSets on TPU slices, created and watched by the operators of
`tasks.backends.gke.operators` and `.evaluate_operators`, through `.adapter` and `.hooks`; every
JobSet is created, waited for (deferred) and deleted by a teardown, which also runs when the job
fails.

Evaluation is one mapped deferrable operator rather than a group per step, so that
``max_active_tis_per_dagrun`` is the eval window exactly (docs/airflow.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import TaskGroup, XComArg

from tasks.backend_api.evaluate_nodes import evaluate_rows, evaluate_step
from tasks.backend_api.lifecycle_names import STOP_GRACE, TRAIN_LABEL
from tasks.backend_api.protocol import FormDefaults, JobKeys, register
from tasks.backend_api.teardown import with_cleanup
from tasks.backends.gke.evaluate_operators import EvaluateJobSetOperator, EvaluateStepJobSetOperator
from tasks.backends.gke.operators import (
    DeleteEvalJobSetsOperator,
    DeleteJobSetOperator,
    RunJobSetOperator,
)
from tasks.backends.gke.settings import TABLE, GkeSettings, check_evaluate_job
from tasks.deployment import BackendName, Deployment
from tasks.jobs.command import Role
from tasks.jobs.templates import SecretKeyRef
from tasks.names import EVALUATE_TASK_ID
from tasks.run.spec import run_dir_of
from tasks.run.train_group import train_command

if TYPE_CHECKING:
    from airflow.sdk.definitions._internal.mixins import DependencyMixin


def jobset_task_group(
    group_id: str,
    settings: GkeSettings,
    *,
    role: Role,
    job: str,
    command: Sequence[str] | XComArg,
    image: str | None = None,
    env: Mapping[str, str] | None = None,
    secret_env: Mapping[str, SecretKeyRef] | None = None,
    job_timeout: timedelta | None = None,
    retries: int = 0,
    stop_run_dir: XComArg | None = None,
    stop_grace: timedelta = STOP_GRACE,
    run_env: Mapping[str, str] | XComArg | None = None,
    queue: Mapping[str, str] | None = None,
) -> TaskGroup:
    """TaskGroup `group_id`: ``run`` (RunJobSetOperator: the JobSet of `command`, rendered in
    the task) -> ``cleanup`` (DeleteJobSetOperator as a teardown of ``run``). Works inside a
    mapped task group (one JobSet per map index); `job_timeout` bounds the JobSet's running
    time. `retries` are for an error of the task itself (a retry adopts the JobSet); a failed
    JobSet is never retried. With `stop_run_dir` the JobSet is deleted `stop_grace` after a
    stop request of that run if still running. `queue`: the deployment's
    ``cluster_task_kwargs``."""
    with TaskGroup(group_id=group_id) as group:
        run = RunJobSetOperator(
            task_id="run", settings=settings, role=role, job=job, command=command, image=image,
            env=env, secret_env=secret_env, job_timeout=job_timeout, stop_run_dir=stop_run_dir,
            stop_grace=stop_grace, run_env=run_env, retries=retries,
            retry_delay=timedelta(seconds=settings.poll_interval_s), **(queue or {}),
        )  # fmt: skip
        cleanup = DeleteJobSetOperator(
            run_task_id=run.task_id, cluster=settings.cluster, **(queue or {})
        )
        with_cleanup(run, cleanup)
    return group


@register
class GkeBackend:
    """Training as ``train_command`` -> TaskGroup ``job`` (run, deferred -> cleanup teardown);
    evaluation as one mapped deferrable operator with a cleanup teardown."""

    name: ClassVar[BackendName] = "gke"
    # Images and Secret envs are the JobSet's own.
    job_keys: ClassVar[JobKeys] = JobKeys(image=True, secret_env=True)
    jobs_run_on_worker: ClassVar[bool] = False
    # TPU jobs run the benchmark itself: the closed division's rules.
    form_defaults: ClassVar[FormDefaults] = FormDefaults(division="closed", max_steps=60)

    def __init__(self, deployment: Deployment) -> None:
        settings = deployment.backend_table(TABLE, GkeSettings)
        check_evaluate_job(settings, deployment.jobs.evaluate.command, deployment.source)
        self.deployment = deployment
        self.settings: GkeSettings = settings
        self.queue = deployment.cluster_task_kwargs()  # every task here talks to the cluster

    def train_job(self, spec: XComArg) -> DependencyMixin:
        # The JobSet is deleted if the trainer has not ended a grace period after the run's
        # stop request (the trainer reads it from storage); only evaluation during training
        # (a run's Param) writes one.
        job, settings = self.deployment.jobs.train, self.settings
        argv, run_env = train_command(job, spec, "python")
        return jobset_task_group(
            "job", settings, role="train", job=TRAIN_LABEL, command=argv, run_env=run_env,
            image=job.image, env=job.env, secret_env=job.secret_env,
            job_timeout=timedelta(minutes=self.deployment.train_timeout_minutes),
            retries=settings.run_retries, stop_run_dir=run_dir_of(spec),
            queue=self.queue,
        )  # fmt: skip

    def _evaluate_kwargs(self) -> dict[str, Any]:
        """What every ``evaluate`` JobSet operator is given: the job, the eval window, the
        bounds; its retries adopt the step's JobSet after a lost watch."""
        d, s = self.deployment, self.settings
        return {
            "task_id": EVALUATE_TASK_ID,
            "settings": s,
            "eval_job": d.jobs.evaluate,
            "max_active_tis_per_dagrun": d.eval_window,
            "job_timeout": timedelta(minutes=d.eval_timeout_minutes),
            "retries": d.eval_retries,
            "retry_delay": timedelta(seconds=s.poll_interval_s),
            **self.queue,
        }

    def evaluate(self, run_dir: str | XComArg, rows: XComArg) -> DependencyMixin:
        cluster, queue = self.settings.cluster, self.queue
        return evaluate_rows(
            EvaluateJobSetOperator, run_dir, rows, self._evaluate_kwargs(),
            lambda task_id: DeleteEvalJobSetsOperator(
                run_task_id=task_id, cluster=cluster, **queue
            ),
        )  # fmt: skip

    def evaluate_checkpoint(self, run_dir: str | XComArg, step: int | XComArg) -> DependencyMixin:
        cluster, queue = self.settings.cluster, self.queue
        return evaluate_step(
            EvaluateStepJobSetOperator, run_dir, step, self._evaluate_kwargs(),
            lambda task_id: DeleteJobSetOperator(run_task_id=task_id, cluster=cluster, **queue),
        )  # fmt: skip
