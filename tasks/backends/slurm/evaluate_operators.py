"""The evaluate operator of the Slurm backend: `tasks.run.evaluate_operator.EvaluateCheckpoint`
(the steps of `tasks.run.stages`, a foreign result, the stop of the higher steps after a pass)
in front of `SlurmJobOperator`, the job labelled and filled for the checkpoint; a higher step's
evaluation is stopped by scancelling its job (`adapter.cancel_step_job`), and such a job's task
ends skipped, naming the step that passed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tasks.backend_api.lifecycle_names import TRAIN_LABEL, WATCHING
from tasks.backends.slurm.adapter import (
    cancel_step_job,
    hook_for,
    job_name,
    job_ref,
    running_job,
)
from tasks.backends.slurm.operators import SlurmJobOperator
from tasks.backends.slurm.triggers import FINISHED, SlurmJobTrigger, step_cancel_args
from tasks.jobs.templates import EvaluateJob
from tasks.run.evaluate_operator import EvaluateCheckpoint, EvaluateStep
from tasks.run.stages import EvalTarget, skip_if_decided

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tasks.backends.slurm.hooks import JobInfo


class SlurmEvaluateOperator(EvaluateCheckpoint, SlurmJobOperator):
    """Evaluate the manifest row `row` as a Slurm job of `eval_job` (see the module doc)."""

    template_fields = (*SlurmJobOperator.template_fields, "run_dir", "row")
    job_started = "the job was submitted"

    @staticmethod
    def job_kwargs(eval_job: EvaluateJob) -> dict[str, Any]:
        return {"env": eval_job.env}

    def eval_python(self) -> str:
        return self.settings.python

    def job_label(self, context: Context) -> str:
        return self.eval_label()

    def job_argv(self, context: Context) -> list[str]:
        return self.eval_argv()

    def cancel_step(self, dag_id: str, run_id: str, step: int) -> bool:
        return cancel_step_job(self.settings, dag_id, run_id, step)

    def step_cancel(self, dag_id: str, run_id: str) -> tuple[str, dict[str, Any]]:
        return "slurm", step_cancel_args(self.settings, dag_id, run_id)

    def before_job(self, context: Context, target: EvalTarget) -> None:
        """Under `eval_in_training_allocation` the training's job evaluates in its own
        allocation after the training: while it runs, wait for it (deferred), then look again
        (`after_training`): a step it evaluated is reused, only one it left gets a job."""
        if not self.settings.eval_in_training_allocation:
            return
        dag_run = context["dag_run"]
        job = running_job(
            hook_for(self.settings),
            job_name(dag_run.dag_id, dag_run.run_id, TRAIN_LABEL),
            self.log,
        )
        if job is None:
            return
        self.log.info(
            "step %d: the training's Slurm job %s evaluates in its allocation: waiting for it",
            target.step, job.job_id,
        )  # fmt: skip
        self.defer(trigger=self.job_trigger(job_ref(job)), method_name="after_training")

    def after_training(self, context: Context, event: Mapping[str, Any]) -> Any:
        if event["phase"] == WATCHING:
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
