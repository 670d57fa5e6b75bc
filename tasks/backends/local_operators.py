"""The local backend's operators and trigger: the cluster-job lifecycle
(`tasks.backend_api.cluster_job`, `.watch_trigger`, `.teardown`) with jobs as process groups of
this machine (`tasks.backends.local_adapter`), so the demo runs the code a cluster's run runs.

- `LocalJobOperator` starts the job (or adopts the one an earlier try left running), records
  it and defers to `LocalJobTrigger`, which copies the job's new output lines into the task log
  (``<name> | <line>``) and ends when the job has: exit 0 succeeds, anything else fails the
  task quoting its last output (a retry starts it again). `LocalTrainOperator` is the training
  job of a run, its argv, env and run owner taken from the run's spec as it runs.
- `CancelLocalJobsOperator` (a teardown) cancels what the run task recorded and left running
  (marked failed by hand, a deferral timeout).
- `LocalEvaluateOperator` / `LocalEvaluateStepOperator`: `EvaluateCheckpoint` in front of
  `LocalJobOperator`; a higher step's evaluation is stopped by signalling its job.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import XComArg
from airflow.sdk.exceptions import AirflowException

from tasks.backend_api.cluster_job import ClusterJobOperator, argv_of
from tasks.backend_api.job_inputs import cluster_job_env, train_inputs
from tasks.backend_api.job_state import JobState
from tasks.backend_api.lifecycle_names import STOPPED, WATCHING
from tasks.backend_api.task_end import JobOutcome, TaskEndSpec
from tasks.backend_api.teardown import CancelRecordedJobs, recorded_jobs
from tasks.backend_api.watch_trigger import WatchTrigger, settle_default
from tasks.backends import local_adapter as adapter
from tasks.backends.local_adapter import DEFAULT_JOBS_ROOT, LocalJob
from tasks.jobs.command import Role
from tasks.jobs.templates import EvaluateJob, TrainJob
from tasks.run.evaluate_operator import EvaluateCheckpoint, EvaluateStep
from tasks.run.spec import RunSpec
from tasks.run.stages import skip_if_decided

if TYPE_CHECKING:
    from airflow.sdk import Context

# The phase of the event of a job that ended (its `exit_code`: None when none was recorded).
FINISHED = "finished"


@dataclass(kw_only=True, eq=False, repr=False)
class LocalJobTrigger(WatchTrigger):
    """Watch the local job `job` (`LocalJob.ref`) every `poll_interval_s` until it has ended;
    one event ``{"phase", "reason", "message", "job", "exit_code", "kwargs"}``: ``finished``,
    ``stopped`` (still running `stop_grace_s` after a stop request of `stop_run_dir`: cancelled)
    or ``watching`` (defer again with `kwargs`). Its output's new lines go to the task log."""

    job: Mapping[str, Any]
    poll_interval_s: float = 2.0
    backoff_max_s: float = 30.0
    outage_budget_s: float = 600.0
    output_offset: int = 0
    settle_s: float = field(default_factory=settle_default)
    cluster_word = "machine"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.job = dict(self.job)

    @property
    def local_job(self) -> LocalJob:
        return LocalJob.from_ref(self.job)

    def where(self) -> str:
        return str(self.job["name"])

    async def read(self) -> JobState:
        return await asyncio.to_thread(adapter.state, self.local_job)

    async def observe(
        self, state: JobState, where: str, now: float
    ) -> tuple[dict[str, Any] | None, bool]:
        self._show_output(where)  # the offset is kept across a re-defer, never a reason for one
        if not state.ended:
            return None, False
        self._show_output(where)
        return self.event(FINISHED, message=state.line, exit_code=state.exit_code), False

    def _show_output(self, where: str) -> None:
        lines, self.output_offset = adapter.read_output(self.local_job, self.output_offset)
        for line in lines:
            self.log.info("%s | %s", where, line)

    async def cancel(self) -> None:
        await asyncio.to_thread(adapter.cancel, self.local_job)

    def job_outcome(self, payload: Any) -> JobOutcome | None:
        name = self.where()
        if payload["phase"] == STOPPED:
            return JobOutcome(self.job, "stopped", f"{name} cancelled: {payload['message']}")
        if payload["phase"] != FINISHED:
            return None
        if payload["exit_code"] == 0:
            return JobOutcome(self.job, "succeeded", f"{name}: finished")
        return JobOutcome(self.job, "failed", f"{name}: {payload['message']}")

    def event(
        self, phase: str, *, reason: str = "", message: str = "", exit_code: int | None = None
    ) -> dict[str, Any]:
        return {
            "phase": phase,
            "reason": reason,
            "message": message,
            "job": self.job,
            "exit_code": exit_code,
            "kwargs": self.kwargs() if phase == WATCHING else None,
        }


class LocalJobOperator(ClusterJobOperator):
    """Run `argv` (a list, or the XComArg of a task returning one) as the local job labelled
    `job` (``train``, ``eval-N``: with the DAG run and `run_dir` it names the job's folder under
    `jobs_root`) with this machine's environment, `env` and `run_env`, and wait, deferred (see
    the module doc). `name` is the job as the log names it. `job_timeout` bounds the wait (then
    the task fails and its teardown cancels the job). Returns ``{"name", "pid",
    "exit_code"}``."""

    template_fields: Sequence[str] = ("argv", "run_env", "stop_run_dir", "run_dir")
    ui_color = "#e8f0fe"
    trigger_type = LocalJobTrigger
    run_dir: str  # a template field: an XComArg is resolved before execute

    def __init__(
        self,
        *,
        role: Role,
        job: str,
        name: str = "",
        argv: Sequence[str] | XComArg = (),
        env: Mapping[str, str] | None = None,
        run_env: Mapping[str, str] | XComArg | None = None,
        run_dir: str | XComArg | None = None,
        jobs_root: str = str(DEFAULT_JOBS_ROOT),
        poll_interval_s: float = 2.0,
        job_timeout: timedelta | None = None,
        settle_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.role: Role = role
        self.job = job
        self.name = name or job
        self.argv = argv
        self.env = dict(env or {})
        self.run_env = run_env
        self.run_dir = run_dir  # type: ignore[assignment]  # see the class's annotation
        self.jobs_root = jobs_root
        self.poll_interval_s = poll_interval_s
        self.job_timeout = job_timeout
        self.settle_s = settle_s

    # --- what the job is (a subclass computes them as the task runs) ------------------------

    def job_label(self, context: Context) -> str:
        return self.job

    def job_name(self, context: Context) -> str:
        return self.name

    def job_argv(self, context: Context) -> list[str]:
        return argv_of(self.argv, "argv", nonempty=True)

    def job_env(self, context: Context) -> dict[str, str]:
        return cluster_job_env(self.env, self.run_env, self.role, context)

    def folder(self, context: Context, label: str) -> Path:
        dag_run = context["dag_run"]
        if not isinstance(self.run_dir, str):
            raise ValueError(f"run_dir must be a path, got {self.run_dir!r}")
        return adapter.job_folder(
            self.jobs_root, dag_run.dag_id, dag_run.run_id, self.run_dir, label
        )

    def after_start(self, context: Context, job: LocalJob) -> None:
        """Called once a job was started (not adopted), before the task defers."""

    # --- the lifecycle's adapter ------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        folder, name = self.folder(context, self.job_label(context)), self.job_name(context)
        argv = self.job_argv(context)
        try:
            job, adopted = adapter.start_or_adopt(folder, name, argv, self.job_env(context))
        except adapter.LocalJobError as exc:
            raise AirflowException(str(exc)) from exc
        ref = job.ref()
        self.record(context, ref, None, "running")
        if adopted:
            self.log.info("%s (pid %d) is running already: adopted", name, job.pid)
        else:
            self.log.info("%s: started %s (pid %d)", name, subprocess.list2cmdline(argv), job.pid)
            self.after_start(context, job)
        self.watch(ref, self.job_trigger(ref, self.task_end_spec(context, ref)))

    def job_trigger(self, ref: Mapping[str, Any], end: TaskEndSpec | None) -> LocalJobTrigger:
        return LocalJobTrigger(
            job=dict(ref),
            poll_interval_s=self.poll_interval_s,
            settle_s=settle_default() if self.settle_s is None else self.settle_s,
            task_end=None if end is None else end.kwargs(),
            **self.stop_kwargs(),
        )

    def defer_timeout(self, trigger: WatchTrigger) -> timedelta | None:
        return self.job_timeout

    def job_ref(self, event: Mapping[str, Any]) -> dict[str, Any]:
        return dict(event["job"])

    def cancel_job(self, ref: Mapping[str, Any]) -> bool:
        return adapter.cancel(LocalJob.from_ref(ref))

    def job_ended(self, context: Context, ref: Mapping[str, Any], event: Mapping[str, Any]) -> Any:
        assert event["phase"] == FINISHED, event
        job = LocalJob.from_ref(ref)
        if event["exit_code"] == 0:
            self.record(context, ref, True, "succeeded")
            self.log.info("%s: finished", job.name)
            return {"name": job.name, "pid": job.pid, "exit_code": 0}
        self.record(context, ref, True, f"failed: {event['message']}")
        if event["exit_code"] == 127 and event["message"] != adapter.ended(127).line:
            raise AirflowException(f"{job.name}: {event['message']}")  # the program, named
        raise AirflowException(
            f"{job.name} {event['message']}; last output lines:\n{adapter.output_tail(job)}"
        )


class LocalTrainOperator(LocalJobOperator):
    """The training job of the run whose RunSpec dict is `spec` (an XComArg): its argv and
    what the run adds to its env from the deployment's ``[jobs.train]`` (`train_inputs`, with
    `python`), named ``train seed N``."""

    template_fields: Sequence[str] = (*LocalJobOperator.template_fields, "spec")

    def __init__(
        self, *, spec: Mapping[str, Any] | XComArg, train_job: TrainJob, python: str, **kwargs: Any
    ) -> None:
        super().__init__(role="train", **kwargs)
        self.spec = spec
        self.train_job = train_job
        self.python = python

    def _run(self) -> RunSpec:
        return RunSpec.from_dict(dict(self.spec))  # type: ignore[arg-type]  # resolved

    def job_name(self, context: Context) -> str:
        return f"train seed {self._run().seed}"

    def job_argv(self, context: Context) -> list[str]:
        return train_inputs(self.train_job, self._run().job_values(), self.python)["argv"]

    def job_env(self, context: Context) -> dict[str, str]:
        added = train_inputs(self.train_job, self._run().job_values(), self.python)["env"]
        return cluster_job_env(self.env, added, self.role, context)


class CancelLocalJobsOperator(CancelRecordedJobs):
    """Teardown: cancel the local jobs that (every instance of) the task `run_task_id` recorded
    and left running; one that ended already is left alone. Then the folders of those that
    have ended go (`local_adapter.remove_folder`: the system temp folder does not fill up with
    a job's files per task). Returns those cancelled (``{"name", "pid"}``)."""

    def execute(self, context: Context) -> Any:
        done = super().execute(context)
        for ref in recorded_jobs(context, self.run_task_id, mapped=self.mapped):
            adapter.remove_folder(LocalJob.from_ref(ref))
        return done

    def cancel_job(self, ref: Mapping[str, Any], why: str) -> dict[str, Any] | None:
        job = LocalJob.from_ref(ref)
        if not adapter.cancel(job):
            self.log.info("%s had ended", job.name)
            return None
        self.log.warning("%s (pid %d) cancelled (%s)", job.name, job.pid, why)
        return {"name": job.name, "pid": job.pid}


class LocalEvaluateOperator(EvaluateCheckpoint, LocalJobOperator):
    """Evaluate the manifest row `row` as a local job of `eval_job` (see the module doc), with
    `python` as its ``{python}``."""

    template_fields = (*LocalJobOperator.template_fields, "row")
    job_started = "the job was started"

    def __init__(self, *, python: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.python = python

    @staticmethod
    def job_kwargs(eval_job: EvaluateJob) -> dict[str, Any]:
        return {}  # its env is the backend's to merge with the deployment's (`job_env`)

    def eval_python(self) -> str:
        return self.python

    def job_label(self, context: Context) -> str:
        return self.eval_label()

    def job_name(self, context: Context) -> str:
        return f"evaluate step {self._target.step}"

    def job_argv(self, context: Context) -> list[str]:
        return self.eval_argv()

    def after_start(self, context: Context, job: LocalJob) -> None:
        # A lower step that passed before this job's record existed could not stop it: look
        # again now that it can (the pass's `cancel_above` ran before).
        try:
            skip_if_decided(self._target)
        except BaseException:
            adapter.cancel(job)
            raise

    def step_cancel(self, dag_id: str, run_id: str) -> tuple[str, dict[str, Any]]:
        return "local", adapter.step_cancel_args(self.jobs_root, dag_id, run_id, self.run_dir)

    def cancel_step(self, dag_id: str, run_id: str, step: int) -> bool:
        return adapter.cancel_step(
            adapter.step_cancel_args(self.jobs_root, dag_id, run_id, self.run_dir), step
        )


class LocalEvaluateStepOperator(EvaluateStep, LocalEvaluateOperator):
    """`LocalEvaluateOperator` for the checkpoint of a planned `step` (evaluation during
    training: the step's wait saw its row committed), read from the manifest."""

    template_fields = (*LocalJobOperator.template_fields, "step")
