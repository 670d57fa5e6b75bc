"""What every backend needs to render a job, once: the argument list from the deployment's
templates (`tasks.jobs.templates`, filled by `tasks.jobs.values`), the environment (the
deployment's and the job's own literal values; `secret_env` names Secret references that a
cluster backend renders in its own terms) and the run owner a training job carries
(`RCPFLOW_RUN_OWNER`, `rcpflow.trainer.ownership`)."""

from __future__ import annotations

from collections.abc import Mapping

from rcpflow.trainer.ownership import OWNER_ENV, airflow_owner
from tasks.jobs.templates import EvaluateJob, TrainJob
from tasks.jobs.values import train_values

__all__ = ["OWNER_ENV", "job_env", "train_argv", "with_run_owner"]


def train_argv(job: TrainJob, job_values: Mapping[str, str | int], python: str) -> list[str]:
    """The training job's argument list: its template filled with the run's values."""
    return job.job_command.render(train_values(job_values, python))


def job_env(base: Mapping[str, str], job: TrainJob | EvaluateJob) -> dict[str, str]:
    """The literal environment of a job: `base` (a deployment's `job_env`), then the job's own."""
    return {**base, **job.env}


def with_run_owner(
    env: Mapping[str, str], dag_id: str, run_id: str, task_id: str
) -> dict[str, str]:
    """`env` plus the run folder's owner: every try, restart and pod of this DAG run's training
    task, and nobody else (`rcpflow.trainer.ownership.airflow_owner`)."""
    return {**env, OWNER_ENV: airflow_owner(dag_id, run_id, task_id)}
