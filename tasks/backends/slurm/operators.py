"""The operators that run a Slurm job, watch it deferred, restart it by the exit-code contract
and cancel it; every cluster call is a `tasks.backends.slurm.hooks` call (imported in the
method that needs it: DAG parsing stays cheap).

- `SlurmJobOperator` renders the batch script in `execute` (never in an XCom, a template field
  or a log line), submits it (or adopts the job of that name an earlier try left running) and
  defers to `SlurmJobTrigger`. When the job ends, `tasks.backends.slurm.outcome.decide` says
  what follows: success; fail at once (2, 5); submit again, counted against `max_restarts`
  (other codes, the time limit) or not (preemption, node failure, SIGTERM). A job someone
  cancelled fails the task, naming it.
- `SlurmEvaluateOperator` evaluates one checkpoint behind the steps of `tasks.run.stages`; a
  pass scancels the evaluation jobs of the higher steps (`cancel_above`), and a job cancelled
  because a lower step passed ends its task skipped, naming that step.
- `CancelSlurmJobsOperator` (a teardown) scancels what the run task recorded, unless the task
  left it running on purpose (a watch error: a retry adopts it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, XComArg
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tasks.backend_api.job_inputs import cluster_job_env
from tasks.backend_api.teardown import should_delete
from tasks.backends.slurm.script import BatchJob, InAllocationEval
from tasks.backends.slurm.settings import JobRole, SlurmJobShape, SlurmSettings
from tasks.backends.slurm.triggers import (
    ERROR,
    FINISHED,
    REUSED,
    STOPPED,
    WATCHING,
    SlurmJobTrigger,
    connection_kwargs,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tasks.backends.slurm.hooks import AnyHook, JobInfo, SubmittedJob

# XCom key of the job the run task submitted: ``{"job_id", "name", "submit_time", "cancel",
# "why"}``; `cancel` None until the task decided (then the teardown cancels it: the rule of
# `tasks.backend_api.teardown.should_delete`, its `delete` named `cancel` here).
JOB_XCOM_KEY = "slurm_job"
_TAIL_BYTES = 4000


def job_name(dag_id: str, run_id: str, label: str) -> str:
    """The Slurm job name of `label` (``train``, ``eval-12``) in one DAG run: the same on every
    try (a retry adopts the job), different for every DAG run."""
    digest = hashlib.sha256(f"{dag_id}\0{run_id}".encode()).hexdigest()[:16]
    return f"rcpflow-{label}-{digest}"


def hook_for(settings: SlurmSettings) -> AnyHook:
    from tasks.backends.slurm.hooks import slurm_hook

    return slurm_hook(settings)


class SlurmJobOperator(BaseOperator):
    """Run `argv` (a list, or the XComArg of a task returning one) as the Slurm job `job` of
    `role` with `env`, and wait, deferred, until it succeeds or the contract fails it (see the
    module doc). `then_evaluate` (the fields of `script.InAllocationEval`, or an XComArg of
    them): evaluate the checkpoints after the training in the same allocation. Returns
    ``{"job_id", "name", "state", "exit_code", "restarts"}``. With `stop_run_dir` the job is
    scancelled `stop_grace` after a stop request of that run."""

    template_fields: Sequence[str] = ("argv", "run_env", "stop_run_dir", "then_evaluate")
    ui_color = "#e6f4ea"

    def __init__(
        self,
        *,
        settings: SlurmSettings,
        role: JobRole,
        job: str,
        argv: Sequence[str] | XComArg = (),
        env: Mapping[str, str] | None = None,
        run_env: Mapping[str, str] | XComArg | None = None,
        stop_run_dir: str | XComArg | None = None,
        stop_grace: timedelta = timedelta(minutes=10),
        then_evaluate: Mapping[str, Any] | XComArg | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.then_evaluate = then_evaluate
        self.settings = settings
        self.role: JobRole = role
        self.job = job
        self.argv = argv
        self.env = dict(env or {})
        self.run_env = run_env
        self.stop_run_dir = stop_run_dir
        self.stop_grace = stop_grace
        self._owned: Mapping[str, Any] | None = None

    @property
    def shape(self) -> SlurmJobShape:
        return self.settings.shape(self.role)

    def job_label(self, context: Context) -> str:
        return self.job

    def job_argv(self, context: Context) -> list[str]:
        argv = self.argv
        if isinstance(argv, str) or not isinstance(argv, Sequence) or not argv:
            raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
        return [str(item) for item in argv]

    def batch_job(self, context: Context) -> BatchJob:
        """The job this task runs (with env values: never log or return it)."""
        dag_run = context["dag_run"]
        env = cluster_job_env(self.env, self.run_env, self.role, context)
        return BatchJob(
            name=job_name(dag_run.dag_id, dag_run.run_id, self.job_label(context)),
            argv=tuple(self.job_argv(context)),
            shape=self.shape,
            working_dir=self.settings.working_dir,
            log_dir=self.settings.log_dir,
            env=env,
            secret_env=self.shape.secret_env,
            then_evaluate=self._then_evaluate(),
        )

    def _then_evaluate(self) -> InAllocationEval | None:
        then = self.then_evaluate
        if then is None:
            return None
        if not isinstance(then, Mapping):
            raise ValueError(f"then_evaluate must be a mapping, got {then!r}")
        return InAllocationEval(
            **{**then, "argv": tuple(then["argv"]), "env": dict(then.get("env") or {})}
        )

    def execute(self, context: Context) -> Any:
        job = self.batch_job(context)
        hook = hook_for(self.settings)
        running = [j for j in hook.find_jobs(job.name) if not j.finished]
        if running:
            found = running[-1]
            from tasks.backends.slurm.hooks import SubmittedJob

            submitted = SubmittedJob(found.job_id, found.name, found.submit_time)
            self.log.info("Slurm job %s (%s) is running already: adopted", found.job_id, job.name)
        else:
            submitted = hook.submit(job)
            self.log.info(
                "Slurm job %s (%s) submitted: %d node(s) x %d task(s), time limit %s",
                submitted.job_id, job.name, self.shape.nodes, self.shape.ntasks_per_node,
                self.shape.time_limit,
            )  # fmt: skip
        self._defer(context, submitted, {"counted": 0, "uncounted": 0})

    def _defer(self, context: Context, job: SubmittedJob, budget: Mapping[str, int]) -> None:
        self._record(context, job.job_id, job.name, job.submit_time, None, "running")
        self._owned = {"job_id": job.job_id}
        s = self.settings
        self.defer(
            trigger=SlurmJobTrigger(
                connection=connection_kwargs(s),
                job={"job_id": job.job_id, "name": job.name, "submit_time": job.submit_time},
                budget=dict(budget),
                poll_interval_s=s.poll_interval_s,
                backoff_max_s=s.backoff_max_s,
                stop_run_dir=self.stop_run_dir if isinstance(self.stop_run_dir, str) else None,
                stop_grace_s=self.stop_grace.total_seconds(),
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> dict[str, Any]:
        from tasks.backends.slurm.hooks import JobInfo
        from tasks.backends.slurm.outcome import decide

        job = event["job"]
        where = f"Slurm job {job['job_id']} ({job['name']})"
        self._owned = {"job_id": job["job_id"]}
        phase = event["phase"]
        if phase == WATCHING:
            if event["message"]:
                self.log.warning("%s: %s", where, event["message"])
            self._owned = None
            self.defer(trigger=SlurmJobTrigger(**event["kwargs"]), method_name="execute_complete")
        if phase == STOPPED:
            self._record_event(context, job, True, "stopped after the run's stop request")
            self.log.warning("%s: %s", where, event["message"])
            return {"job_id": job["job_id"], "name": job["name"], "state": "STOPPED"}
        if phase == ERROR:
            if event["reason"] == REUSED:
                self._record_event(context, job, False, "the id names another job")
                raise AirflowFailException(event["message"])
            self._record_event(context, job, False, event["message"])
            raise AirflowException(f"{where}: {event['message']}; a retry submits it again")
        assert phase == FINISHED, event
        info = JobInfo(**event["info"])
        budget = dict(event["budget"])
        outcome = decide(
            info, self.settings.fail_exit_codes, self.shape.signal_grace_s, self.shape.time_limit_s
        )
        self.log.info("%s ended: %s", where, outcome.why)
        if outcome.decision == "succeeded":
            self._record_event(context, job, True, "succeeded")
            return {
                "job_id": info.job_id,
                "name": info.name,
                "state": info.state,
                "exit_code": info.exit_code,
                "restarts": budget,
            }
        if outcome.decision == "cancelled":
            self._record_event(context, job, True, "cancelled")
            self.on_cancelled(context, info)
            raise AirflowFailException(f"{where} was cancelled by someone else ({outcome.why})")
        if outcome.decision in ("restart_counted", "restart_uncounted"):
            counted = outcome.decision == "restart_counted"
            if counted and budget["counted"] >= self.shape.max_restarts:
                self._record_event(context, job, True, "failed, no restart left")
                raise AirflowFailException(
                    f"{where}: {outcome.why}; no restart left ({budget['counted']} of "
                    f"max_restarts={self.shape.max_restarts} used){self._tail(info)}"
                )
            budget["counted" if counted else "uncounted"] += 1
            self._record_event(context, job, True, f"restarted: {outcome.why}")
            new = hook_for(self.settings).submit(self.batch_job(context))
            self.log.warning(
                "%s: submitted again as Slurm job %s (restarts: %d counted of %d, %d uncounted)",
                where, new.job_id, budget["counted"], self.shape.max_restarts,
                budget["uncounted"],
            )  # fmt: skip
            self._defer(context, new, budget)
        self._record_event(context, job, True, f"failed: {outcome.why}")
        raise AirflowFailException(
            f"{where}: {outcome.why}; not restarted (an Airflow retry would fail the same way)"
            f"{self._tail(info)}"
        )

    def on_cancelled(self, context: Context, info: JobInfo) -> None:
        """A cancelled job's hook: the evaluate operator skips when a lower step passed."""

    def _tail(self, info: JobInfo) -> str:
        if not info.stdout_path:
            return ""
        try:
            hook = hook_for(self.settings)
            text, _ = hook.read_output(info.stdout_path, 0)
        except Exception as exc:
            return f"\n(output {info.stdout_path} not read: {exc})"
        return f"\nlast output of {info.stdout_path}:\n{text[-_TAIL_BYTES:]}"

    def on_kill(self) -> None:
        """The task is killed (marked by hand, a timeout): scancel the job it owns."""
        if self._owned is not None:
            hook_for(self.settings).cancel(str(self._owned["job_id"]))
            self.log.warning("killed: Slurm job %s scancelled", self._owned["job_id"])

    def _record_event(
        self, context: Context, job: Mapping[str, Any], cancel: bool, why: str
    ) -> None:
        self._record(context, job["job_id"], job["name"], job["submit_time"], cancel, why)

    def _record(
        self,
        context: Context,
        job_id: str,
        name: str,
        submit_time: int,
        cancel: bool | None,
        why: str,
    ) -> None:
        value = {
            "job_id": job_id,
            "name": name,
            "submit_time": submit_time,
            "cancel": cancel,
            "why": why,
        }
        context["ti"].xcom_push(key=JOB_XCOM_KEY, value=value)


class CancelSlurmJobsOperator(BaseOperator):
    """Teardown: scancel the jobs that (every instance of) the task `run_task_id` recorded,
    unless it left one running on purpose; a job that ended already, or whose id names another
    job now, is left alone."""

    ui_color = "#fce8e6"

    def __init__(
        self, *, run_task_id: str, settings: SlurmSettings, mapped: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.run_task_id = run_task_id
        self.settings = settings
        self.mapped = mapped

    def execute(self, context: Context) -> list[dict[str, Any]]:
        from tasks.backends.slurm.hooks import SlurmError, SubmittedJob

        ti = context["ti"]
        if self.mapped:
            found = ti.xcom_pull(task_ids=self.run_task_id, key=JOB_XCOM_KEY)
        else:
            found = ti.xcom_pull(
                task_ids=self.run_task_id, key=JOB_XCOM_KEY, map_indexes=ti.map_index
            )
        refs = [found] if isinstance(found, dict) else [r for r in found or [] if r]
        done = []
        hook = hook_for(self.settings) if refs else None
        for ref in refs:
            where = f"Slurm job {ref['job_id']} ({ref['name']})"
            wanted, why = should_delete(ref, key="cancel")
            if not wanted:
                self.log.warning("%s is left as it is: %s", where, why)
                continue
            assert hook is not None
            expected = SubmittedJob(ref["job_id"], ref["name"], ref["submit_time"])
            try:
                info = hook.job(expected.job_id, expected)
            except SlurmError as exc:
                self.log.info("%s: not cancelled: %s", where, exc)
                continue
            if info.finished:
                self.log.info("%s had ended (%s)", where, info.state)
                continue
            hook.cancel(expected.job_id)
            self.log.warning("%s scancelled (%s)", where, why)
            done.append({"job_id": expected.job_id, "name": expected.name})
        return done
