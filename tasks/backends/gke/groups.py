"""Task-group builders of the GKE backend: every JobSet is created, waited for (deferred) and
deleted by a teardown, which also runs when the job fails.

Evaluation is one mapped deferrable operator rather than a group per step, so that
``max_active_tis_per_dagrun`` is the eval window exactly (docs/airflow.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import TaskGroup, XComArg, task

from tasks.backend_api.job_inputs import TrainInputs, train_inputs, train_inputs_of
from tasks.backends.gke.evaluate_operators import EvaluateJobSetOperator, EvaluateStepJobSetOperator
from tasks.backends.gke.operators import (
    DeleteEvalJobSetsOperator,
    DeleteJobSetOperator,
    RunJobSetOperator,
)
from tasks.backends.gke.settings import GkeSettings
from tasks.jobs.command import Role
from tasks.jobs.templates import EvaluateJob, SecretKeyRef, TrainJob
from tasks.run.spec import RunSpec, XComValue

if TYPE_CHECKING:
    from airflow.sdk.definitions._internal.mixins import DependencyMixin
    from airflow.sdk.types import Operator


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
    stop_grace: timedelta = timedelta(minutes=10),
    run_env: Mapping[str, str] | XComArg | None = None,
) -> TaskGroup:
    """TaskGroup `group_id`: ``run`` (RunJobSetOperator: the JobSet of `command`, rendered in
    the task) -> ``cleanup`` (DeleteJobSetOperator as a teardown of ``run``). Works inside a
    mapped task group (one JobSet per map index); `job_timeout` bounds the JobSet's running
    time. `retries` are for an error of the task itself (a retry adopts the JobSet); a failed
    JobSet is never retried. With `stop_run_dir` the JobSet is deleted `stop_grace` after a
    stop request of that run if still running."""
    with TaskGroup(group_id=group_id) as group:
        run = RunJobSetOperator(
            task_id="run",
            settings=settings,
            role=role,
            job=job,
            command=command,
            image=image,
            env=env,
            secret_env=secret_env,
            job_timeout=job_timeout,
            stop_run_dir=stop_run_dir,
            stop_grace=stop_grace,
            run_env=run_env,
            retries=retries,
            retry_delay=timedelta(seconds=settings.poll_interval_s),
        )
        _cleanup_after(run, DeleteJobSetOperator, settings)
    return group


def _cleanup_after(
    work: Operator,
    cleanup: type[DeleteJobSetOperator | DeleteEvalJobSetsOperator],
    settings: GkeSettings,
) -> None:
    """``cleanup``, a `cleanup` operator as the teardown of `work`: it deletes what `work`
    created, also when `work` fails."""
    (
        work
        >> cleanup(
            task_id="cleanup", run_task_id=work.task_id, cluster=settings.cluster
        ).as_teardown()
    )


def train_jobset_group(
    settings: GkeSettings,
    job: TrainJob,
    spec: XComArg,
    *,
    job_timeout: timedelta,
    stop_run_dir: XComArg | None = None,
) -> TaskGroup:
    """``train_command`` (the training job's argument list and what the run adds to its env,
    `job_inputs.train_inputs`: no job env, no JobSet in an XCom) ->
    TaskGroup ``job`` (run -> cleanup)."""

    @task(multiple_outputs=True)
    def train_command(spec: XComValue) -> TrainInputs:
        """The job's argv and what the run adds to its env (`job_inputs.train_inputs`)."""
        run = RunSpec.from_dict(spec)
        return train_inputs(job, run.job_values(), "python")

    argv, run_env = train_inputs_of(train_command(spec))
    return jobset_task_group(
        "job",
        settings,
        role="train",
        job="train",
        command=argv,
        run_env=run_env,
        image=job.image,
        env=job.env,
        secret_env=job.secret_env,
        job_timeout=job_timeout,
        retries=settings.run_retries,
        stop_run_dir=stop_run_dir,
    )


def _evaluate_kwargs(
    settings: GkeSettings, job: EvaluateJob, eval_window: int, job_timeout: timedelta, retries: int
) -> dict[str, Any]:
    """What every ``evaluate`` JobSet operator is given: the job, the eval window, the bounds;
    `retries` adopt the step's JobSet after a lost watch."""
    return {
        "task_id": "evaluate",
        "settings": settings,
        "job": job,
        "max_active_tis_per_dagrun": eval_window,
        "job_timeout": job_timeout,
        "retries": retries,
        "retry_delay": timedelta(seconds=settings.poll_interval_s),
    }


def evaluate_jobsets(
    settings: GkeSettings,
    job: EvaluateJob,
    run_dir: str | XComArg,
    rows: XComArg,
    *,
    eval_window: int,
    job_timeout: timedelta,
    retries: int = 0,
) -> DependencyMixin:
    """The mapped ``evaluate`` operator (one instance per row) and its ``cleanup`` teardown;
    `retries` (the deployment's eval_retries) adopt the step's JobSet after a lost watch."""
    evaluate = EvaluateJobSetOperator.partial(
        run_dir=run_dir,
        map_index_template="step {{ task.row['step'] }}",
        **_evaluate_kwargs(settings, job, eval_window, job_timeout, retries),
    ).expand(row=rows)
    _cleanup_after(evaluate, DeleteEvalJobSetsOperator, settings)
    return evaluate


def evaluate_jobset(
    settings: GkeSettings,
    job: EvaluateJob,
    run_dir: str | XComArg,
    step: int | XComArg,
    *,
    eval_window: int,
    job_timeout: timedelta,
    retries: int = 0,
) -> DependencyMixin:
    """``evaluate`` of the checkpoint of `step` inside a mapped task group (evaluation during
    training) and its per-index ``cleanup`` teardown (deletes only that instance's JobSet)."""
    # run_dir and step are template fields: an XComArg is resolved before execute
    resolved: dict[str, Any] = {"run_dir": run_dir, "step": step}
    evaluate = EvaluateStepJobSetOperator(
        map_index_template="step {{ task.step }}",
        **_evaluate_kwargs(settings, job, eval_window, job_timeout, retries),
        **resolved,
    )
    _cleanup_after(evaluate, DeleteJobSetOperator, settings)
    return evaluate
