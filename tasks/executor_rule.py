"""Which Airflow executors a backend whose jobs run on the worker (`Backend.jobs_run_on_worker`:
the local backend) can run under.

The local backend runs its jobs as processes of the worker that runs the task, and stops a
running evaluation by the PID another task recorded, so every task of a run must run on one
host: under the LocalExecutor (or the SequentialExecutor), never under a distributed one
(Celery, Kubernetes, Edge), where a job would start on whichever worker took the task and a
stop would signal a PID on another machine. Such a deployment is refused in one line when the
run DAG chooses its backend (`tasks.backend_api.protocol.driver_for`); the cluster backends
(slurm, gke) run anywhere.
Why and how to deploy: docs/deploy.md.
"""

from __future__ import annotations

from tasks.deployment import BackendName, Deployment, DeploymentError

# Executors whose tasks all run on the scheduler's own host.
SINGLE_HOST_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor"})


def executor_classes(executor: str) -> list[str]:
    """The class names ``[core] executor`` names: a comma list of names, module paths or
    ``alias:path`` entries (Airflow's multiple executors)."""
    entries = [entry.strip() for entry in executor.split(",") if entry.strip()]
    return [entry.split(":")[-1].rsplit(".", 1)[-1] for entry in entries]


def executor_refusal(executor: str, backend: BackendName, source: str) -> str | None:
    """The one line refusing `backend`, whose jobs run as processes of the worker, under
    `executor` (``[core] executor``), None if it may run there."""
    distributed = [c for c in executor_classes(executor) if c not in SINGLE_HOST_EXECUTORS]
    if not distributed:
        return None
    return (
        f"{source}: backend: {backend!r} runs jobs as processes of the Airflow worker, so it "
        f"needs every task on one host (LocalExecutor), but [core] executor is {executor!r}: "
        "use a cluster backend (slurm, gke) under a distributed executor (docs/deploy.md)"
    )


def refuse_distributed_executor(deployment: Deployment) -> None:
    """Raise DeploymentError when Airflow's configured executor cannot run the deployment's
    backend, whose jobs run on the worker (`executor_refusal`)."""
    from airflow.configuration import conf

    refusal = executor_refusal(conf.get("core", "executor"), deployment.backend, deployment.source)
    if refusal is not None:
        raise DeploymentError(refusal)
