"""The GKE backend in the run and eval groups: jobs as JobSets through `tasks.gke`.

Training: ``train_jobset`` renders the JobSet at run time (its name needs the run id), then the
gke helper's ``jobset_task_group`` creates it, waits deferred, and deletes it as a teardown.

Evaluation: one deferrable, mapped operator, so that ``max_active_tis_per_dagrun`` (which
counts deferred instances) is the eval window exactly as on the local backend. Each instance
takes the same gate as the local one (skip when a lower step passed, reuse a valid summary)
*before* creating anything on the cluster, and reads and validates the summary after its
JobSet succeeded. One teardown deletes every JobSet the instances recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import TaskGroup, XComArg, get_current_context, task

from plugins.jobset import REF_XCOM_KEY, DeleteJobSetOperator, RunJobSetOperator
from tasks.deployment import Deployment, load_deployment
from tasks.gke import GkeSettings, jobset_task_group, render_jobset
from tasks.local_jobs import EVALUATE_MODULE, TRAIN_MODULE, evaluate_args
from tasks.run_spec import RunSpec

if TYPE_CHECKING:
    from airflow.sdk import Context

log = logging.getLogger(__name__)


def gke_settings(deployment: Deployment) -> GkeSettings:
    if deployment.gke is None:
        raise ValueError(f"{deployment.source}: backend 'gke' needs a [gke] table")
    return deployment.gke


def gke_train_group(deployment: Deployment, spec: XComArg) -> TaskGroup:
    """``train_jobset`` -> TaskGroup ``job`` (run, deferred -> cleanup teardown)."""
    settings = gke_settings(deployment)

    @task
    def train_jobset(spec: dict[str, Any]) -> dict[str, Any]:
        dag_run = get_current_context()["dag_run"]
        return render_jobset(
            settings,
            role="train",
            dag_id=dag_run.dag_id,
            run_id=dag_run.run_id,
            job="train",
            module=TRAIN_MODULE,
            args=RunSpec(**spec).train_args(),
        )

    return jobset_task_group(
        "job",
        train_jobset(spec),
        settings,
        job_timeout=timedelta(minutes=deployment.train_timeout_minutes),
    )


class EvaluateJobSetOperator(RunJobSetOperator):
    """Evaluate one manifest row as a JobSet, behind the same gate as the local backend."""

    template_fields = (*RunJobSetOperator.template_fields, "run_dir", "row")

    def __init__(self, *, run_dir: str, row: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(jobset={}, **kwargs)  # rendered in execute: the run id is needed
        self.run_dir = run_dir
        self.row = row

    def execute(self, context: Context) -> Any:
        from tasks.eval_group import collect, eval_target, reusable, skip_if_decided

        context["eval_step"] = self.row["step"]  # type: ignore[typeddict-unknown-key]
        target = eval_target(self.run_dir, dict(self.row))
        skip_if_decided(target)
        if reusable(target):
            return collect(target)
        dag_run = context["dag_run"]
        self.jobset = render_jobset(
            gke_settings(load_deployment()),
            role="evaluate",
            dag_id=dag_run.dag_id,
            run_id=dag_run.run_id,
            job=f"eval-{target.step}",
            module=EVALUATE_MODULE,
            args=evaluate_args(run_dir=self.run_dir, step=target.step),
        )
        return super().execute(context)

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> Any:
        from tasks.eval_group import collect, eval_target, skip_if_decided

        context["eval_step"] = self.row["step"]  # type: ignore[typeddict-unknown-key]
        target = eval_target(self.run_dir, dict(self.row))
        try:
            super().execute_complete(context, event)
        except Exception:
            skip_if_decided(target)  # a lower step passed meanwhile: this failure is moot
            raise
        return collect(target)


class DeleteEvalJobSetsOperator(DeleteJobSetOperator):
    """Teardown: delete every JobSet that any instance of the mapped evaluate task recorded."""

    def execute(self, context: Context) -> list[dict[str, Any]]:
        refs = context["ti"].xcom_pull(task_ids=self.run_task_id, key=REF_XCOM_KEY)
        if isinstance(refs, dict):
            refs = [refs]
        done = []
        for ref in [r for r in refs or [] if r is not None]:
            deleted = self._delete(context, ref)
            log.info(
                "JobSet %s/%s %s",
                ref["namespace"],
                ref["name"],
                "deleted" if deleted else "already gone",
            )
            done.append({**ref, "deleted": deleted})
        return done


def gke_evaluate(deployment: Deployment, run_dir: str | XComArg, rows: XComArg) -> tuple[Any, Any]:
    """The mapped ``evaluate`` operator and its ``cleanup`` teardown."""
    settings = gke_settings(deployment)
    cluster = settings.connection_kwargs()
    evaluate = EvaluateJobSetOperator.partial(
        task_id="evaluate",
        run_dir=run_dir,
        map_index_template="step {{ eval_step }}",
        max_active_tis_per_dagrun=deployment.eval_window,
        poll_interval_s=settings.poll_interval_s,
        job_timeout=timedelta(minutes=deployment.eval_timeout_minutes),
        **cluster,
    ).expand(row=rows)
    cleanup = DeleteEvalJobSetsOperator(task_id="cleanup", run_task_id=evaluate.task_id, **cluster)
    evaluate >> cleanup.as_teardown()
    return evaluate, cleanup
