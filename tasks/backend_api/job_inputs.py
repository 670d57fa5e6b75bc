"""What every backend needs to render a job, once: the argument list from the deployment's
templates (`tasks.jobs.templates`, filled by `tasks.jobs.values`), the environment (the
deployment's and the job's own literal values; `secret_env` names Secret references that a
cluster backend renders in its own terms), what one run adds to the training job's environment
(`run_env`: its result format's, e.g. NeMo-RL's ``MLPERF_MLLOG_FILE``) and the run owner a
training job carries (`RCPFLOW_RUN_OWNER`, `rcpflow.trainer.ownership`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from airflow.sdk import Context

from rcpflow.trainer.ownership import OWNER_ENV, airflow_owner
from tasks.jobs.templates import EvaluateJob, TrainJob
from tasks.jobs.values import train_values

__all__ = [
    "OWNER_ENV",
    "TrainInputs",
    "cluster_job_env",
    "job_env",
    "run_env",
    "train_argv",
    "train_inputs",
    "with_run_env",
    "with_run_owner",
]


def train_argv(job: TrainJob, job_values: Mapping[str, str | int], python: str) -> list[str]:
    """The training job's argument list: its template filled with the run's values."""
    return job.job_command.render(train_values(job_values, python))


def run_env(job: TrainJob, run_dir: str, seed: int) -> dict[str, str]:
    """What one run adds to its training job's environment, the same on every backend: the
    train job's result format's (`TrainJob.result_env`; NeMo-RL's trainer gets
    ``MLPERF_MLLOG_FILE``, the run folder's MLLOG). Paths only, never a secret: a cluster
    backend may pass it in an XCom."""
    return job.result_env(run_dir, seed)


class TrainInputs(TypedDict):
    """One run's training job: its argument list and what the run adds to its environment."""

    argv: list[str]
    env: dict[str, str]


def train_inputs(job: TrainJob, job_values: Mapping[str, str | int], python: str) -> TrainInputs:
    """`train_argv` and `run_env` of one run (`job_values`: `RunSpec.job_values`)."""
    return {
        "argv": train_argv(job, job_values, python),
        "env": run_env(job, str(job_values["run_dir"]), int(job_values["seed"])),
    }


def job_env(base: Mapping[str, str], job: TrainJob | EvaluateJob) -> dict[str, str]:
    """The literal environment of a job: `base` (a deployment's `job_env`), then the job's own."""
    return {**base, **job.env}


def with_run_owner(
    env: Mapping[str, str], dag_id: str, run_id: str, task_id: str
) -> dict[str, str]:
    """`env` plus the run folder's owner: every try, restart and pod of this DAG run's training
    task, and nobody else (`rcpflow.trainer.ownership.airflow_owner`)."""
    return {**env, OWNER_ENV: airflow_owner(dag_id, run_id, task_id)}


def with_run_env(env: Mapping[str, str], added: object) -> dict[str, str]:
    """`env` plus a run's `run_env` as a cluster operator gets it (resolved from the XCom of
    `train_inputs`'s ``env``; None or empty for a job without one)."""
    if added is None:
        return dict(env)
    if not isinstance(added, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in added.items()
    ):
        raise ValueError(f"run_env must map names to strings, got {added!r}")
    return {**env, **added}


def cluster_job_env(
    env: Mapping[str, str], added: object, role: str, context: Context
) -> dict[str, str]:
    """A cluster job's environment as its task runs: `env`, what the run adds (`with_run_env`)
    and, for training, the run folder's owner: every pod, restart and retry of this DAG run's
    training task (`with_run_owner`)."""
    out = with_run_env(env, added)
    if role == "train":
        dag_run = context["dag_run"]
        out = with_run_owner(out, dag_run.dag_id, dag_run.run_id, context["ti"].task_id)
    return out
