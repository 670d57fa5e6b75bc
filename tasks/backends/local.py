"""The local backend: training and evaluation jobs as process groups of this machine, run
through the same cluster-job lifecycle as the cluster backends (`tasks.backend_api`): the
operators and trigger of `tasks.backends.local_operators`, the process calls of
`tasks.backends.local_adapter`. JAX is only ever imported in the jobs.

It is single-host: the worker that starts a job, the triggerer that watches it and the teardown
that cancels it must run on the same machine (they find the job by its process and its files
in this machine's temp folder).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from tasks.backend_api.evaluate_nodes import evaluate_rows, evaluate_step
from tasks.backend_api.job_inputs import job_env
from tasks.backend_api.lifecycle_names import TRAIN_LABEL
from tasks.backend_api.protocol import FormDefaults, JobKeys, register
from tasks.backend_api.teardown import with_cleanup
from tasks.backends.local_adapter import DEFAULT_JOBS_ROOT
from tasks.backends.local_operators import (
    CancelLocalJobsOperator,
    LocalEvaluateOperator,
    LocalEvaluateStepOperator,
    LocalTrainOperator,
)
from tasks.deployment import MAX_EVAL_WINDOW, BackendName, Deployment
from tasks.jobs.templates import EvaluateJob, TrainJob
from tasks.names import EVALUATE_TASK_ID
from tasks.run.evaluation_group import RCP_VIEW_DOC
from tasks.run.spec import run_dir_of

if TYPE_CHECKING:
    from airflow.sdk import XComArg
    from airflow.sdk.definitions._internal.mixins import DependencyMixin

# The task id of the training job in the ``train`` group (the demo reads its log by it).
TRAIN_JOB_TASK_ID = "train_job"


@register
class LocalBackend:
    """Jobs as local process groups: the deployment's ``[jobs]`` templates, run with its
    interpreter and environment (``job_env``, then the job's own ``env``). Training is task
    ``train_job`` with its ``cleanup`` teardown; evaluation is the mapped ``evaluate`` with
    its own."""

    name: ClassVar[BackendName] = "local"
    # The worker runs no images and holds no Secrets of a cluster.
    job_keys: ClassVar[JobKeys] = JobKeys()
    jobs_run_on_worker: ClassVar[bool] = True
    # The default jobs are the toy: it learns at its own learning rate (open division) and
    # passes within 40 steps at gbs 256 (the demo's setting).
    form_defaults: ClassVar[FormDefaults] = FormDefaults(division="open", max_steps=40)

    def __init__(self, deployment: Deployment, jobs_root: str = str(DEFAULT_JOBS_ROOT)) -> None:
        self.deployment = deployment
        self.train: TrainJob = deployment.jobs.train
        self.evaluate_job: EvaluateJob = deployment.jobs.evaluate
        self.jobs_root = jobs_root

    def train_job(self, spec: XComArg) -> DependencyMixin:
        d = self.deployment
        run = LocalTrainOperator(
            task_id=TRAIN_JOB_TASK_ID, job=TRAIN_LABEL, spec=spec, train_job=self.train,
            python=d.job_python, env=job_env(d.job_env, self.train), run_dir=run_dir_of(spec),
            stop_run_dir=run_dir_of(spec), jobs_root=self.jobs_root,
            job_timeout=timedelta(minutes=d.train_timeout_minutes),
        )  # fmt: skip
        with_cleanup(run, CancelLocalJobsOperator(run_task_id=run.task_id))
        return run

    def _evaluate_kwargs(self, window: int) -> dict[str, Any]:
        d = self.deployment
        return {
            "task_id": EVALUATE_TASK_ID,
            "eval_job": self.evaluate_job,
            "python": d.job_python,
            "env": job_env(d.job_env, self.evaluate_job),
            "jobs_root": self.jobs_root,
            "job_timeout": timedelta(minutes=d.eval_timeout_minutes),
            "max_active_tis_per_dagrun": window,
            "retries": d.eval_retries,
            "retry_delay": timedelta(seconds=d.checkpoint_poll_seconds),
            "doc_md": RCP_VIEW_DOC,
        }

    def evaluate(self, run_dir: str | XComArg, rows: XComArg) -> DependencyMixin:
        kwargs = self._evaluate_kwargs(self.deployment.eval_window)
        return evaluate_rows(
            LocalEvaluateOperator, run_dir, rows, kwargs,
            lambda task_id: CancelLocalJobsOperator(run_task_id=task_id, mapped=True),
        )  # fmt: skip

    def evaluate_checkpoint(self, run_dir: str | XComArg, step: int | XComArg) -> DependencyMixin:
        # The run's own window (a Param) is held by the step's wait; this is only a ceiling.
        return evaluate_step(
            LocalEvaluateStepOperator, run_dir, step, self._evaluate_kwargs(MAX_EVAL_WINDOW),
            lambda task_id: CancelLocalJobsOperator(run_task_id=task_id),
        )  # fmt: skip
