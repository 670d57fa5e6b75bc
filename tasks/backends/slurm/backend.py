"""The Slurm backend: jobs as Slurm batch jobs, submitted and watched by the operators of
`tasks.backends.slurm.operators` and `.evaluate_operators`, through the hooks of `.hooks`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import TaskGroup, get_current_context, task

from tasks.backend_api.job_inputs import TrainInputs, train_inputs, train_inputs_of
from tasks.backend_api.protocol import FormDefaults, register
from tasks.backends.slurm.adapter import cancel_step_job
from tasks.backends.slurm.evaluate_operators import SlurmEvaluateOperator, SlurmEvaluateStepOperator
from tasks.backends.slurm.operators import CancelSlurmJobsOperator, SlurmJobOperator
from tasks.backends.slurm.script import IN_ALLOCATION_STEP_FIELDS
from tasks.backends.slurm.settings import TABLE, SlurmSettings
from tasks.deployment import BackendName, Deployment, DeploymentError
from tasks.jobs.command import fill
from tasks.run.spec import RunSpec, XComValue, run_dir_of

if TYPE_CHECKING:
    from airflow.sdk import XComArg
    from airflow.sdk.definitions._internal.mixins import DependencyMixin
    from airflow.sdk.types import Operator


def _cleanup_after(work: Operator, settings: SlurmSettings, *, mapped: bool = False) -> None:
    """``cleanup``: scancel what `work` submitted, as its teardown (also when it fails)."""
    cleanup = CancelSlurmJobsOperator(
        task_id="cleanup", run_task_id=work.task_id, settings=settings, mapped=mapped
    )
    work >> cleanup.as_teardown()


def _check_in_allocation(deployment: Deployment, settings: SlurmSettings) -> None:
    """Refuse what an evaluation in the training's allocation cannot do, naming the key."""
    where = f"{deployment.source}: slurm.eval_in_training_allocation"
    job = deployment.jobs.evaluate
    if job.result.imported:
        raise DeploymentError(
            f"{where}: jobs.evaluate.result is {job.result.format!r}; in the allocation only "
            "rcpflow's own summary ({summary_dir}/summary.json) can be written"
        )
    per_row = sorted(job.job_command.placeholders - {"python", "run_dir", "seed"}
                     - set(IN_ALLOCATION_STEP_FIELDS))  # fmt: skip
    if per_row:
        raise DeploymentError(
            f"{where}: jobs.evaluate.command uses {', '.join(per_row)}, which the batch script "
            f"cannot fill (it may use {', '.join(IN_ALLOCATION_STEP_FIELDS)}, run_dir, seed)"
        )
    if settings.evaluate.nodes > settings.train.nodes:
        raise DeploymentError(
            f"{where}: slurm.evaluate.nodes={settings.evaluate.nodes} is more than the "
            f"training's allocation (slurm.train.nodes={settings.train.nodes})"
        )


@register
class SlurmBackend:
    """Training as one Slurm job (TaskGroup ``job``: run -> cleanup teardown), evaluation as one
    mapped deferrable operator, one Slurm job per checkpoint (the eval window W is W concurrent
    evaluation jobs, each its own allocation), with a cleanup teardown."""

    name: ClassVar[BackendName] = "slurm"
    jobs_run_on_worker: ClassVar[bool] = False
    # GPU clusters run the benchmark itself: the closed division's rules.
    form_defaults: ClassVar[FormDefaults] = FormDefaults(division="closed", max_steps=60)

    def __init__(self, deployment: Deployment) -> None:
        settings = deployment.backend_table(TABLE, SlurmSettings)
        self.deployment = deployment
        self.settings: SlurmSettings = settings
        if settings.eval_in_training_allocation:
            _check_in_allocation(deployment, settings)

    def train_job(self, spec: XComArg) -> DependencyMixin:
        settings, job = self.settings, self.deployment.jobs.train

        @task(multiple_outputs=True)
        def train_command(spec: XComValue) -> TrainInputs:
            """The job's argv and what the run adds to its env (`job_inputs.train_inputs`)."""
            run = RunSpec.from_dict(spec)
            return train_inputs(job, run.job_values(), settings.python)

        argv, run_env = train_inputs_of(train_command(spec))
        then_evaluate = None
        if settings.eval_in_training_allocation:
            evaluate = self.deployment.jobs.evaluate

            @task
            def in_allocation_evaluation(spec: XComValue) -> dict[str, Any]:
                """The evaluate command with only ``{step}``/``{summary_dir}`` left, and the
                steps the training may save."""
                run = RunSpec.from_dict(spec)
                values = run.job_values()
                known = {"python": settings.python, "run_dir": values["run_dir"],
                         "seed": values["seed"]}  # fmt: skip
                escaped = {
                    k: str(v).replace("{", "{{").replace("}", "}}") for k, v in known.items()
                }
                left = {name: f"{{{name}}}" for name in IN_ALLOCATION_STEP_FIELDS}
                shape = settings.evaluate
                return {
                    "argv": [fill(item, {**escaped, **left}) for item in evaluate.command],
                    "python": settings.python,
                    "run_dir": str(values["run_dir"]),
                    "first": int(values["val_start_at"]),
                    "last": int(values["max_steps"]),
                    "nodes": shape.nodes,
                    "ntasks_per_node": shape.ntasks_per_node,
                    "env": dict(evaluate.env),
                }

            then_evaluate = in_allocation_evaluation(spec)
        with TaskGroup(group_id="job") as group:
            run = SlurmJobOperator(
                task_id="run",
                settings=settings,
                role="train",
                job="train",
                argv=argv,
                env=job.env,
                run_env=run_env,
                stop_run_dir=run_dir_of(spec),
                then_evaluate=then_evaluate,
                retries=settings.run_retries,
            )
            _cleanup_after(run, settings)
        return group

    def _evaluate_kwargs(self) -> dict[str, Any]:
        d = self.deployment
        return {
            "task_id": "evaluate",
            "settings": self.settings,
            "eval_job": d.jobs.evaluate,
            "max_active_tis_per_dagrun": d.eval_window,
            "retries": d.eval_retries,
        }

    def evaluate(self, run_dir: str | XComArg, rows: XComArg) -> DependencyMixin:
        evaluate = SlurmEvaluateOperator.partial(
            run_dir=run_dir,
            map_index_template="step {{ task.row['step'] }}",
            **self._evaluate_kwargs(),
        ).expand(row=rows)
        _cleanup_after(evaluate, self.settings, mapped=True)
        return evaluate

    def evaluate_checkpoint(self, run_dir: str | XComArg, step: int | XComArg) -> DependencyMixin:
        resolved: dict[str, Any] = {"run_dir": run_dir, "step": step}
        evaluate = SlurmEvaluateStepOperator(
            map_index_template="step {{ task.step }}", **self._evaluate_kwargs(), **resolved
        )
        _cleanup_after(evaluate, self.settings)
        return evaluate

    def cancel_evaluation(self, run_dir: str, step: int) -> bool:
        """scancel the step's evaluation job of this DAG run (named as `job_name` names it);
        False when none was running."""
        context = get_current_context()
        return cancel_step_job(self.settings, context["dag"].dag_id, context["run_id"], step)
