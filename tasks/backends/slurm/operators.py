"""The operators that run a Slurm job, watch it deferred, restart it by the exit-code contract
and cancel it: the Slurm side of the cluster-job lifecycle (`tasks.backend_api.cluster_job`,
`tasks.backend_api.teardown`); every cluster call is in `tasks.backends.slurm.adapter` (through
`tasks.backends.slurm.hooks`).

- `SlurmJobOperator` renders the batch script in `execute` (never in an XCom, a template field
  or a log line), submits it (or adopts the job of that name an earlier try left running) and
  defers to `SlurmJobTrigger`; on a retry, a job of that name that ended with success is
  taken as it is (no new job, no deferral). When the job ends,
  `tasks.backends.slurm.outcome.decide` says what follows: success; fail at once (2, 5);
  submit again, counted against `max_restarts` (other codes, the time limit) or not
  (preemption, node failure, SIGTERM). A job someone cancelled fails the task, naming it.
- `CancelSlurmJobsOperator` (a teardown) scancels what the run task recorded, unless the task
  left it running on purpose (a watch error: a retry adopts it).
The operators that evaluate a checkpoint as a Slurm job are in
`tasks.backends.slurm.evaluate_operators`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import XComArg
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tasks.backend_api.cluster_job import ClusterJobOperator, argv_of
from tasks.backend_api.job_inputs import cluster_job_env
from tasks.backend_api.lifecycle_names import ERROR
from tasks.backend_api.teardown import CancelRecordedJobs
from tasks.backends.slurm.adapter import hook_for, job_name, job_ref, submit_or_adopt
from tasks.backends.slurm.in_allocation import in_allocation_eval
from tasks.backends.slurm.script import BatchJob
from tasks.backends.slurm.settings import SlurmJobShape, SlurmSettings
from tasks.backends.slurm.triggers import (
    FINISHED,
    REUSED,
    SlurmJobTrigger,
    connection_kwargs,
    contract_kwargs,
    event_payload,
)
from tasks.jobs.command import Role

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tasks.backends.slurm.hooks import JobInfo, SubmittedJob

_TAIL_BYTES = 4000


# How the log names a Slurm job (`ClusterJobOperator.log_name`).
LOG_NAME = "Slurm job {job_id} ({name})"
_where = LOG_NAME.format_map


class SlurmJobOperator(ClusterJobOperator):
    """Run `argv` (a list, or the XComArg of a task returning one) as the Slurm job `job` of
    `role` with `env`, and wait, deferred, until it succeeds or the contract fails it (see the
    module doc). `then_evaluate` (the fields of `script.InAllocationEval`, or an XComArg of
    them): evaluate the checkpoints after the training in the same allocation. Returns
    ``{"job_id", "name", "state", "exit_code", "restarts"}``. With `stop_run_dir` the job is
    scancelled `stop_grace` after a stop request of that run."""

    template_fields: Sequence[str] = ("argv", "run_env", "stop_run_dir", "then_evaluate")
    ui_color = "#e6f4ea"
    trigger_type = SlurmJobTrigger
    log_name = LOG_NAME

    def __init__(
        self,
        *,
        settings: SlurmSettings,
        role: Role,
        job: str,
        argv: Sequence[str] | XComArg = (),
        env: Mapping[str, str] | None = None,
        run_env: Mapping[str, str] | XComArg | None = None,
        then_evaluate: Mapping[str, Any] | XComArg | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.then_evaluate = then_evaluate
        self.settings = settings
        self.role: Role = role
        self.job = job
        self.argv = argv
        self.env = dict(env or {})
        self.run_env = run_env

    @property
    def shape(self) -> SlurmJobShape:
        return self.settings.shape(self.role)

    def job_label(self, context: Context) -> str:
        return self.job

    def job_argv(self, context: Context) -> list[str]:
        return argv_of(self.argv, "argv", nonempty=True)

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
            then_evaluate=in_allocation_eval(self.then_evaluate),
            export_env=self.settings.export_env,
        )

    def execute(self, context: Context) -> Any:
        from tasks.backends.slurm.hooks import JobInfo

        job = self.batch_job(context)
        budget = {"counted": 0, "uncounted": 0}
        retry = getattr(context["ti"], "try_number", 1) > 1
        found = submit_or_adopt(hook_for(self.settings), job, self.log, retry=retry)
        if isinstance(found, JobInfo):
            # It ended with success before this try: its outcome now, no deferral (a trigger
            # that fires at once is what Airflow's scheduler race needs, docs/slurm.md).
            ref = job_ref(found)
            self.record(context, ref, None, "running")
            return self.execute_complete(context, event_payload(FINISHED, ref, budget, info=found))
        self._watch(context, found, budget)

    def _watch(self, context: Context, job: SubmittedJob, budget: Mapping[str, int]) -> None:
        ref = job_ref(job)
        self.record(context, ref, None, "running")
        end = self.task_end_spec(context, ref)
        trigger = self.job_trigger(
            ref,
            budget=dict(budget),
            contract=contract_kwargs(self.settings, self.shape),
            task_end=None if end is None else end.kwargs(),
            **self.stop_kwargs(),
        )
        self.watch(ref, trigger)

    def job_trigger(self, ref: Mapping[str, Any], **kwargs: Any) -> SlurmJobTrigger:
        """The trigger that watches the job of `ref` with these settings."""
        s = self.settings
        return SlurmJobTrigger(
            connection=connection_kwargs(s),
            job=dict(ref),
            poll_interval_s=s.poll_interval_s,
            backoff_max_s=s.backoff_max_s,
            outage_budget_s=s.outage_budget_s,
            **kwargs,
        )

    def job_ref(self, event: Mapping[str, Any]) -> dict[str, Any]:
        return dict(event["job"])

    def cancel_job(self, ref: Mapping[str, Any]) -> bool:
        hook_for(self.settings).cancel(str(ref["job_id"]))
        return True

    def stopped(self, ref: Mapping[str, Any], event: Mapping[str, Any]) -> Any:
        return {"job_id": ref["job_id"], "name": ref["name"], "state": "STOPPED"}

    def job_ended(self, context: Context, ref: Mapping[str, Any], event: Mapping[str, Any]) -> Any:
        from tasks.backends.slurm.hooks import JobInfo
        from tasks.backends.slurm.outcome import decide

        where, phase = _where(ref), event["phase"]
        if phase == ERROR:
            if event["reason"] == REUSED:
                self.record(context, ref, False, "the id names another job")
                raise AirflowFailException(event["message"])
            self.record(context, ref, False, event["message"])
            raise AirflowException(f"{where}: {event['message']}; a retry submits it again")
        assert phase == FINISHED, event
        info = JobInfo(**event["info"])
        budget = dict(event["budget"])
        outcome = decide(
            info, self.settings.fail_exit_codes, self.shape.signal_grace_s, self.shape.time_limit_s
        )
        self.log.info("%s ended: %s", where, outcome.why)
        if outcome.decision == "succeeded":
            self.record(context, ref, True, "succeeded")
            return {
                "job_id": info.job_id,
                "name": info.name,
                "state": info.state,
                "exit_code": info.exit_code,
                "restarts": budget,
            }
        if outcome.decision == "cancelled":
            self.record(context, ref, True, "cancelled")
            self.on_cancelled(context, info)
            raise AirflowFailException(f"{where} was cancelled by someone else ({outcome.why})")
        if outcome.decision in ("restart_counted", "restart_uncounted"):
            counted = outcome.decision == "restart_counted"
            if counted and budget["counted"] >= self.shape.max_restarts:
                self.record(context, ref, True, "failed, no restart left")
                raise AirflowFailException(
                    f"{where}: {outcome.why}; no restart left ({budget['counted']} of "
                    f"max_restarts={self.shape.max_restarts} used){self._tail(info)}"
                )
            budget["counted" if counted else "uncounted"] += 1
            self.record(context, ref, True, f"restarted: {outcome.why}")
            new = hook_for(self.settings).submit(self.batch_job(context))
            self.log.warning(
                "%s: submitted again as Slurm job %s (restarts: %d counted of %d, %d uncounted)",
                where, new.job_id, budget["counted"], self.shape.max_restarts,
                budget["uncounted"],
            )  # fmt: skip
            self._watch(context, new, budget)
        self.record(context, ref, True, f"failed: {outcome.why}")
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
            text, _ = hook_for(self.settings).read_output(info.stdout_path, 0)
        except Exception as exc:
            return f"\n(output {info.stdout_path} not read: {exc})"
        return f"\nlast output of {info.stdout_path}:\n{text[-_TAIL_BYTES:]}"


class CancelSlurmJobsOperator(CancelRecordedJobs):
    """Teardown: scancel the jobs that (every instance of) the task `run_task_id` recorded,
    unless it left one running on purpose; a job that ended already, or whose id names another
    job now, is left alone. Returns the jobs scancelled (``{"job_id", "name"}``)."""

    log_name = LOG_NAME

    def __init__(self, *, settings: SlurmSettings, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings

    def cancel_job(self, ref: Mapping[str, Any], why: str) -> dict[str, Any] | None:
        from tasks.backends.slurm.hooks import SlurmError, SubmittedJob

        expected = SubmittedJob(ref["job_id"], ref["name"], ref["submit_time"])
        hook = hook_for(self.settings)
        try:
            info = hook.job(expected.job_id, expected)
        except SlurmError as exc:
            self.log.info("%s: not cancelled: %s", _where(ref), exc)
            return None
        if info.finished:
            self.log.info("%s had ended (%s)", _where(ref), info.state)
            return None
        hook.cancel(expected.job_id)
        self.log.warning("%s scancelled (%s)", _where(ref), why)
        return {"job_id": expected.job_id, "name": expected.name}
