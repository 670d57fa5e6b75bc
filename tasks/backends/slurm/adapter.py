"""The Slurm adapter of the cluster-job lifecycle (`tasks.backend_api.cluster_job`): the
cluster calls of a Slurm job's life, each through `tasks.backends.slurm.hooks` (imported in the
function: DAG parsing stays cheap): the job's name in a DAG run (`job_name`, the same on every
try), the running job of a name an earlier try left (`running_job`), submit or adopt
(`submit_or_adopt`), and scancel one step's evaluation job (`cancel_step_job`)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from tasks.backend_api.lifecycle_names import eval_label

if TYPE_CHECKING:
    from tasks.backends.slurm.hooks import AnyHook, JobInfo, SubmittedJob
    from tasks.backends.slurm.script import BatchJob
    from tasks.backends.slurm.settings import SlurmSettings


def job_name(dag_id: str, run_id: str, label: str) -> str:
    """The Slurm job name of `label` (``train``, ``eval-12``) in one DAG run: the same on every
    try (a retry adopts the job), different for every DAG run."""
    digest = hashlib.sha256(f"{dag_id}\0{run_id}".encode()).hexdigest()[:16]
    return f"rcpflow-{label}-{digest}"


def hook_for(settings: SlurmSettings) -> AnyHook:
    from tasks.backends.slurm.hooks import slurm_hook

    return slurm_hook(settings)


def running_job(hook: AnyHook, name: str) -> JobInfo | None:
    """The latest job of `name` that has not ended, if any."""
    running = [j for j in hook.find_jobs(name) if not j.finished]
    return running[-1] if running else None


def job_ref(job: SubmittedJob | JobInfo) -> dict[str, Any]:
    """The reference the lifecycle keeps of a job (its record, the trigger's kwargs)."""
    return {"job_id": job.job_id, "name": job.name, "submit_time": job.submit_time}


def submit_or_adopt(hook: AnyHook, job: BatchJob, log: Any) -> SubmittedJob:
    """The job of `job`'s name an earlier try left running (adopted), else `job` submitted."""
    from tasks.backends.slurm.hooks import SubmittedJob

    found = running_job(hook, job.name)
    if found is not None:
        log.info("Slurm job %s (%s) is running already: adopted", found.job_id, job.name)
        return SubmittedJob(found.job_id, found.name, found.submit_time)
    submitted = hook.submit(job)
    shape = job.shape
    log.info(
        "Slurm job %s (%s) submitted: %d node(s) x %d task(s), time limit %s",
        submitted.job_id, job.name, shape.nodes, shape.ntasks_per_node, shape.time_limit,
    )  # fmt: skip
    return submitted


def cancel_step_job(settings: SlurmSettings, dag_id: str, run_id: str, step: int) -> bool:
    """scancel the running evaluation job of `step` in that DAG run; False when none runs."""
    hook = hook_for(settings)
    running = [
        j for j in hook.find_jobs(job_name(dag_id, run_id, eval_label(step))) if not j.finished
    ]
    for job in running:
        hook.cancel(job.job_id)
    return bool(running)
