"""The Slurm backend: jobs as Slurm batch jobs, submitted and watched by the operators of
`tasks.backends.slurm.operators` and `.evaluate_operators`, through the hooks of `.hooks`."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import TaskGroup, task

from tasks.backend_api.evaluate_nodes import evaluate_rows, evaluate_step
from tasks.backend_api.lifecycle_names import TRAIN_LABEL
from tasks.backend_api.protocol import FormDefaults, JobKeys, register
from tasks.backend_api.teardown import with_cleanup
from tasks.backends.slurm.evaluate_operators import SlurmEvaluateOperator, SlurmEvaluateStepOperator
from tasks.backends.slurm.in_allocation import check_in_allocation, in_allocation_fields
from tasks.backends.slurm.operators import CancelSlurmJobsOperator, SlurmJobOperator
from tasks.backends.slurm.settings import TABLE, SlurmSettings
from tasks.deployment import BackendName, Deployment
from tasks.names import EVALUATE_TASK_ID
from tasks.run.spec import RunSpec, XComValue, run_dir_of
from tasks.run.train_group import train_command

if TYPE_CHECKING:
    from airflow.sdk import XComArg
    from airflow.sdk.definitions._internal.mixins import DependencyMixin


@register
class SlurmBackend:
    """Training as one Slurm job (TaskGroup ``job``: run -> cleanup teardown), evaluation as one
    mapped deferrable operator, one Slurm job per checkpoint (the eval window W is W concurrent
    evaluation jobs, each its own allocation), with a cleanup teardown."""

    name: ClassVar[BackendName] = "slurm"
    # An image is a Pyxis container, a secret a reference on the cluster: [slurm.<role>] keys.
    job_keys: ClassVar[JobKeys] = JobKeys(image="container_image", secret_env="secret_env")
    jobs_run_on_worker: ClassVar[bool] = False
    # GPU clusters run the benchmark itself: the closed division's rules.
    form_defaults: ClassVar[FormDefaults] = FormDefaults(division="closed", max_steps=60)

    def __init__(self, deployment: Deployment) -> None:
        settings = deployment.backend_table(TABLE, SlurmSettings)
        self.deployment = deployment
        self.settings: SlurmSettings = settings
        self.queue = deployment.cluster_task_kwargs()  # every task here talks to the cluster
        if settings.eval_in_training_allocation:
            check_in_allocation(deployment, settings)

    def train_job(self, spec: XComArg) -> DependencyMixin:
        settings, job = self.settings, self.deployment.jobs.train
        argv, run_env = train_command(job, spec, settings.python)
        queue = self.queue
        then_evaluate = None
        if settings.eval_in_training_allocation:
            evaluate = self.deployment.jobs.evaluate

            @task
            def in_allocation_evaluation(spec: XComValue) -> dict[str, Any]:
                """The evaluate command with only ``{step}``/``{summary_dir}`` left, and the
                steps the training may save (`in_allocation_fields`)."""
                values = RunSpec.from_dict(spec).job_values()
                return in_allocation_fields(evaluate, settings, values)

            then_evaluate = in_allocation_evaluation(spec)
        with TaskGroup(group_id="job") as group:
            run = SlurmJobOperator(
                task_id="run", settings=settings, role="train", job=TRAIN_LABEL, argv=argv,
                env=job.env, run_env=run_env, stop_run_dir=run_dir_of(spec),
                then_evaluate=then_evaluate, retries=settings.run_retries,
                retry_delay=timedelta(seconds=settings.poll_interval_s), **queue,
            )  # fmt: skip
            cleanup = CancelSlurmJobsOperator(run_task_id=run.task_id, settings=settings, **queue)
            with_cleanup(run, cleanup)
        return group

    def _evaluate_kwargs(self) -> dict[str, Any]:
        d = self.deployment
        return {
            "task_id": EVALUATE_TASK_ID,
            "settings": self.settings,
            "eval_job": d.jobs.evaluate,
            "max_active_tis_per_dagrun": d.eval_window,
            "retries": d.eval_retries,
            # soon: a retry takes the job that ended with success only within slurmctld's
            # MinJobAge (300 s by default, Airflow's default delay), docs/slurm.md
            "retry_delay": timedelta(seconds=self.settings.poll_interval_s),
            **self.queue,
        }

    def evaluate(self, run_dir: str | XComArg, rows: XComArg) -> DependencyMixin:
        return evaluate_rows(
            SlurmEvaluateOperator, run_dir, rows, self._evaluate_kwargs(),
            lambda task_id: self._cleanup(task_id, mapped=True),
        )  # fmt: skip

    def evaluate_checkpoint(self, run_dir: str | XComArg, step: int | XComArg) -> DependencyMixin:
        return evaluate_step(
            SlurmEvaluateStepOperator, run_dir, step, self._evaluate_kwargs(), self._cleanup
        )

    def _cleanup(self, task_id: str, *, mapped: bool = False) -> CancelSlurmJobsOperator:
        return CancelSlurmJobsOperator(
            run_task_id=task_id, settings=self.settings, mapped=mapped, **self.queue
        )
