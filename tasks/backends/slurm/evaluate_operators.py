"""The operators that evaluate one checkpoint as a Slurm job of the deployment's evaluate job,
behind the steps of `tasks.run.stages` (a decided or already evaluated step submits nothing),
importing a foreign result when the job succeeded, both as `tasks.run.evaluate_operator` has
every backend do them; a pass scancels the higher steps' evaluation jobs (`cancel_step_job`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tasks.backend_api.lifecycle_names import WATCHING, event_phase
from tasks.backends.slurm.adapter import cancel_step_job, hook_for, job_name, job_ref, running_job
from tasks.backends.slurm.operators import SlurmJobOperator
from tasks.backends.slurm.settings import SlurmSettings
from tasks.backends.slurm.triggers import FINISHED, SlurmJobTrigger
from tasks.jobs.templates import EvaluateJob
from tasks.jobs.values import evaluate_values
from tasks.names import TRAIN_TASK_ID
from tasks.run.evaluate_operator import EvaluateCheckpoint, EvaluateStep, eval_label
from tasks.run.stages import EvalTarget, cancel_above, skip_if_decided

if TYPE_CHECKING:
    from airflow.sdk import Context

    from rcpflow.records.manifest import ManifestRow
    from tasks.backends.slurm.hooks import JobInfo
    from tasks.jobs.values import Values


class SlurmEvaluateOperator(EvaluateCheckpoint, SlurmJobOperator):
    """Evaluate the manifest row `row` as a Slurm job of `eval_job` (see the module doc)."""

    template_fields = (*SlurmJobOperator.template_fields, "run_dir", "row")
    job_started = "the job was submitted"
    failure_is_stop = True

    def __init__(
        self,
        *,
        settings: SlurmSettings,
        eval_job: EvaluateJob,
        run_dir: str,
        row: Mapping[str, Any],
        **kwargs: Any,
    ) -> None:
        super().__init__(settings=settings, role="evaluate", job="", env=eval_job.env, **kwargs)
        self.eval_job = eval_job
        self.run_dir = run_dir
        self.row = row

    def eval_values(self, row: ManifestRow) -> Values:
        return evaluate_values(self.run_dir, row, self.settings.python)

    def job_label(self, context: Context) -> str:
        return eval_label(self.target().step)

    def job_argv(self, context: Context) -> list[str]:
        return self.eval_job.job_command.render(self.eval_values(self.target().row))

    def before_job(self, context: Context, target: EvalTarget) -> None:
        if self.settings.eval_in_training_allocation:
            self._wait_for_the_training(context, target.step)

    def after_collect(
        self, context: Context, target: EvalTarget, result: dict[str, Any]
    ) -> dict[str, Any]:
        if result["target_reached"]:
            dag_run = context["dag_run"]
            settings = self.settings

            def cancel(run_dir: str, step: int) -> bool:
                return cancel_step_job(settings, dag_run.dag_id, dag_run.run_id, step)

            cancel_above(target.run_dir, target.step, cancel)
        return result

    def _wait_for_the_training(self, context: Context, step: int) -> None:
        """Under `eval_in_training_allocation` the training's job evaluates in its own
        allocation after the training: while it runs, wait for it (deferred), then look again
        (`after_training`): a step it evaluated is reused, only one it left gets a job."""
        dag_run = context["dag_run"]
        name = job_name(dag_run.dag_id, dag_run.run_id, TRAIN_TASK_ID)
        job = running_job(hook_for(self.settings), name)
        if job is None:
            return
        self.log.info(
            "step %d: the training's Slurm job %s evaluates in its allocation: waiting for it",
            step, job.job_id,
        )  # fmt: skip
        self.defer(trigger=self.job_trigger(job_ref(job)), method_name="after_training")

    def after_training(self, context: Context, event: Mapping[str, Any]) -> Any:
        if event_phase(event["phase"]) == WATCHING:
            self.defer(trigger=SlurmJobTrigger(**event["kwargs"]), method_name="after_training")
        if event["phase"] != FINISHED:
            self.log.warning("the training's job: %s; going on", event["message"])
        return self.execute(context)

    def on_cancelled(self, context: Context, info: JobInfo) -> None:
        skip_if_decided(self.target(), stopped=True)


class SlurmEvaluateStepOperator(EvaluateStep, SlurmEvaluateOperator):
    """`SlurmEvaluateOperator` for the checkpoint of a planned `step` (evaluation during
    training: the step's wait saw its row committed), read from the manifest."""

    template_fields = (*SlurmJobOperator.template_fields, "run_dir", "step")
