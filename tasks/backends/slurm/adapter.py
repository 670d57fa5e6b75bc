"""The cluster calls of a Slurm job's life that the driver (`tasks.backends.slurm.driver`)
makes, each through `tasks.backends.slurm.hooks` (imported in the function: DAG parsing stays
cheap): the job's name in a DAG run (`job_name`, the same on every try, and its role back:
`role_of`), the running jobs of a name an earlier try left (`running_job`), and submit or
adopt (`submit_or_adopt`). Only jobs of
the submitting account carrying rcpflow's comment are adopted, waited for or cancelled
(`hooks._OwnJobs.refusal`); another's job of the same name is named in the log and left
alone."""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

from tasks.backend_api.lifecycle_names import TRAIN_LABEL

_LOG = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tasks.backends.slurm.hooks import AnyHook, JobInfo, SubmittedJob
    from tasks.backends.slurm.script import BatchJob
    from tasks.backends.slurm.settings import SlurmSettings
    from tasks.jobs.command import Role


def job_name(dag_id: str, run_id: str, label: str) -> str:
    """The Slurm job name of `label` (``train``, ``eval-12``) in one DAG run: the same on every
    try (a retry adopts the job), different for every DAG run."""
    digest = hashlib.sha256(f"{dag_id}\0{run_id}".encode()).hexdigest()[:16]
    return f"rcpflow-{label}-{digest}"


def role_of(name: str) -> Role:
    """The role of the job named `name` by `job_name` (its label: ``train`` or ``eval-N``)."""
    return "train" if name.startswith(f"rcpflow-{TRAIN_LABEL}-") else "evaluate"


def hook_for(settings: SlurmSettings) -> AnyHook:
    from tasks.backends.slurm.hooks import slurm_hook

    return slurm_hook(settings)


def own_jobs(hook: AnyHook, name: str, log: Any = None) -> list[JobInfo]:
    """rcpflow's jobs of `name` (oldest first, ended ones too while slurmctld knows them);
    each job of that name that is not rcpflow's is named in `log` (one line) and left out."""
    ours = []
    for job in hook.find_jobs(name):
        why = hook.refusal(job)
        if why is not None:
            (log or _LOG).warning("%s", why)
        else:
            ours.append(job)
    return ours


def running_jobs(hook: AnyHook, name: str, log: Any = None) -> list[JobInfo]:
    """rcpflow's jobs of `name` that have not ended (`own_jobs`)."""
    return [j for j in own_jobs(hook, name, log) if not j.finished]


def running_job(hook: AnyHook, name: str, log: Any = None) -> JobInfo | None:
    """The latest of rcpflow's jobs of `name` that has not ended, if any (`running_jobs`)."""
    running = running_jobs(hook, name, log)
    return running[-1] if running else None


def state_line(info: JobInfo) -> str:
    """A running job as the task log states it."""
    return f"{info.state} on {info.nodes or '(no nodes yet)'}" + (
        f", Slurm restart {info.restarts}" if info.restarts else ""
    )


def job_ref(job: SubmittedJob | JobInfo) -> dict[str, Any]:
    """The reference the lifecycle keeps of a job (its record, the trigger's kwargs)."""
    return {"job_id": job.job_id, "name": job.name, "submit_time": job.submit_time}


def submit_or_adopt(
    hook: AnyHook, job: BatchJob, log: Any, *, retry: bool = False
) -> SubmittedJob | JobInfo:
    """The job of `job`'s name an earlier try left running (adopted), else, on a `retry`, the
    latest one if it ended with success (a `JobInfo`: the earlier try's verdict was lost, e.g.
    to Airflow's scheduler race of docs/slurm.md, and the retry takes it instead of running it
    again), else `job` submitted."""
    from tasks.backends.slurm.hooks import SubmittedJob

    ours = own_jobs(hook, job.name, log)
    running = [j for j in ours if not j.finished]
    if running:
        found = running[-1]
        log.info("Slurm job %s (%s) is running already: adopted", found.job_id, job.name)
        return SubmittedJob(found.job_id, found.name, found.submit_time)
    if retry and ours and ours[-1].state == "COMPLETED" and ours[-1].exit_code == 0:
        log.info("Slurm job %s (%s) has ended with success: adopted", ours[-1].job_id, job.name)
        return ours[-1]
    submitted = hook.submit(job)
    shape = job.shape
    log.info(
        "Slurm job %s (%s) submitted: %d node(s) x %d task(s), time limit %s",
        submitted.job_id, job.name, shape.nodes, shape.ntasks_per_node, shape.time_limit,
    )  # fmt: skip
    return submitted
