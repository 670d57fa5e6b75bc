"""GKE backend: run rcpflow jobs as JobSets on TPU slices, watched by a deferrable operator.

Importing this package is cheap (standard library only; no Airflow, provider or kubernetes
modules), so DAG files and the deployment config may import it at parse time.

API for the DAG/task-group side
-------------------------------
``GkeSettings.from_mapping(section)``
    Cluster, image, service account and TPU shapes (``train``: v5p 4x4x8 = 128 chips;
    ``evaluate``: 16 workers of v5p 2x2x1 = 64 chips) with defaults; GkeSettingsError names the
    bad key (``gke.train.topology: ...``).

``render_jobset(settings, *, role, dag_id, run_id, job, module, args) -> dict``
    The JobSet for ``python -m <module> <args...>`` (argument list, no shell) as ``role``
    ``"train"`` or ``"evaluate"``; its name is ``jobset_name(dag_id, run_id, job)``, unique and
    stable per DAG run and job (use ``job="train"`` and ``job=f"eval-{step}"``). `args` are
    the same strings the local backend passes after ``python -m <module>``. Call it at run time
    (inside a task: the run id is only known then) and return the dict as the task's XCom.

``jobset_task_group(group_id, jobset, settings, *, job_timeout=None) -> TaskGroup``
    ml-auto-solutions shape: ``run`` (create the JobSet, defer until it is terminal, fail with
    the controller's reason) -> ``cleanup`` (delete it; a teardown, so it runs when ``run``
    fails too). `jobset` is a dict or, usually, the XComArg of the task that rendered it;
    the group works inside a mapped task group (one JobSet per map index).

Wiring example (inside a task-group factory in tasks/)::

    from airflow.sdk import task
    from tasks.gke import GkeSettings, jobset_task_group, render_jobset

    @task
    def eval_jobset(run_dir: str, step: int, **context) -> dict:
        run = context["dag_run"]
        return render_jobset(
            settings, role="evaluate", dag_id=run.dag_id, run_id=run.run_id,
            job=f"eval-{step}", module="tpu_jobs.evaluate",
            args=["--run-dir", run_dir, "--step", str(step)],
        )

    job = jobset_task_group(
        "eval_job", eval_jobset(run_dir, step), settings, job_timeout=timedelta(hours=2)
    )
    gate >> job >> read_summary   # downstream waits for `run`, not for the teardown

``run`` returns ``{"name", "namespace", "phase", "progress"}`` (its XCom). A Failed JobSet
fails ``run`` with the controller's reason and no Airflow retry (restarts are the shape's
``max_restarts``, i.e. the JobSet's failurePolicy); a watch error fails it retryably and the
retry adopts the same JobSet. Tested: tests/gke (CRD schema, recorded statuses, the provider's
hooks against a stand-in Kubernetes API, ``dag.test()`` of the group).

The operators and trigger live in ``plugins/jobset.py``; the status reading in
``tasks.gke.status`` (``interpret_status``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from tasks.gke.jobset import (
    JobSetConflictError,
    jobset_name,
    render_jobset,
    run_label,
)
from tasks.gke.settings import GkeSettings, GkeSettingsError, TpuJobShape
from tasks.gke.status import JobSetStatus, JobSetStatusError, interpret_status

if TYPE_CHECKING:
    from airflow.sdk import TaskGroup, XComArg

__all__ = [
    "GkeSettings",
    "GkeSettingsError",
    "JobSetConflictError",
    "JobSetStatus",
    "JobSetStatusError",
    "TpuJobShape",
    "interpret_status",
    "jobset_name",
    "jobset_task_group",
    "render_jobset",
    "run_label",
]


def jobset_task_group(
    group_id: str,
    jobset: dict[str, Any] | XComArg,
    settings: GkeSettings,
    *,
    job_timeout: timedelta | None = None,
) -> TaskGroup:
    """TaskGroup `group_id`: ``run`` (RunJobSetOperator, deferrable) -> ``cleanup``
    (DeleteJobSetOperator as a teardown of ``run``). Build it inside a DAG (or task group)
    context. `job_timeout` bounds the wait for the JobSet (then the task fails and cleanup
    deletes the JobSet)."""
    from airflow.sdk import TaskGroup

    from plugins.jobset import DeleteJobSetOperator, RunJobSetOperator

    cluster = settings.connection_kwargs()
    with TaskGroup(group_id=group_id) as group:
        run = RunJobSetOperator(
            task_id="run",
            jobset=jobset,
            poll_interval_s=settings.poll_interval_s,
            job_timeout=job_timeout,
            **cluster,
        )
        cleanup = DeleteJobSetOperator(task_id="cleanup", run_task_id=run.task_id, **cluster)
        run >> cleanup.as_teardown()
    return group
