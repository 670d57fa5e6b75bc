"""The one run-job operator (`RunJobOperator`), for every driver: it records the job it starts
(`lifecycle_names.JOB_RECORD_KEY`, the rule of `teardown`; before the submit where the driver
knows its reference then: `JobDriver.planned_ref`), starts it or adopts
the one an earlier try left running (`JobDriver.submit_or_adopt`), defers to the one
`WatchTrigger` and again on every `WATCHING` event, ends on a stop request's `STOPPED` event,
decides the task's outcome from the job's (`job_ended`: the restart policy is applied here,
once, for a driver that restarts jobs), and cancels what it owns when killed (`on_kill`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, XComArg
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tasks.backend_api.job_inputs import cluster_job_env
from tasks.backend_api.job_state import JobState
from tasks.backend_api.lifecycle_names import (
    JOB_RECORD_KEY,
    RECORD_DECISION,
    STOP_GRACE,
    STOPPED,
    WATCHING,
)
from tasks.backend_api.task_end import TaskEndSpec
from tasks.backend_api.watch_trigger import WatchTrigger, settle_default

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tasks.backend_api.protocol import JobDriver, JobRequest, Submitted
    from tasks.jobs.command import Role


class JobReplacedError(AirflowFailException):
    """The job's name holds another object than the one the task started or adopted (deleted
    and created again, an id reused): not the task's to follow, nor to cancel."""


class RunJobOperator(BaseOperator):
    """Run the job `label` of `role` through `driver` and wait for it, deferred (see the module
    doc): `argv` (a list, or an XComArg resolving to one), `env` (literal), `run_env` (what the
    run adds, an XComArg resolved; `job_inputs.cluster_job_env` adds the run owner of a
    training), `extra` (the driver's own, `JobRequest.extra`). With `stop_run_dir` the job is
    cancelled `stop_grace` after a stop request of that run. `job_timeout` bounds the wait
    (the driver's `defer_timeout`). Returns ``{**ref, "outcome", "exit_code", "restarts"}``."""

    template_fields: Sequence[str] = ("argv", "run_env", "extra", "run_dir", "stop_run_dir")
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        driver: JobDriver,
        role: Role,
        label: str,
        argv: Sequence[str] | XComArg = (),
        env: Mapping[str, str] | None = None,
        run_env: Mapping[str, str] | XComArg | None = None,
        extra: Mapping[str, Any] | XComArg | None = None,
        run_dir: str | XComArg | None = None,
        stop_run_dir: str | XComArg | None = None,
        stop_grace: timedelta = STOP_GRACE,
        job_timeout: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.driver = driver
        self.role: Role = role
        self.fixed_label = label
        self.argv = argv
        self.env = dict(env or {})
        self.run_env = run_env
        self.extra = extra
        self.run_dir = run_dir
        self.stop_run_dir = stop_run_dir
        self.stop_grace = stop_grace
        self.job_timeout = job_timeout
        self._owned: Mapping[str, Any] | None = None

    # --- what the job is (the evaluate operator computes them as the task runs) -----------

    def job_label(self) -> str:
        return self.fixed_label

    def job_argv(self) -> list[str]:
        return argv_of(self.argv, "argv", nonempty=True)

    def job_run_dir(self) -> str:
        for run_dir in (self.run_dir, self.stop_run_dir):
            if isinstance(run_dir, str):
                return run_dir
        return ""

    def request(self, context: Context) -> JobRequest:
        """What this try asks the driver for (with env values: never log or return it)."""
        from tasks.backend_api.protocol import JobRequest

        dag_run = context["dag_run"]
        extra = self.extra
        if extra is not None and not isinstance(extra, Mapping):
            raise ValueError(f"extra must be a mapping, got {extra!r}")
        return JobRequest(
            role=self.role,
            label=self.job_label(),
            dag_id=dag_run.dag_id,
            run_id=dag_run.run_id,
            run_dir=self.job_run_dir(),
            argv=tuple(self.job_argv()),
            env=cluster_job_env(self.env, self.run_env, self.role, context),
            extra=None if extra is None else dict(extra),
            timeout_s=None if self.job_timeout is None else self.job_timeout.total_seconds(),
            retry=getattr(context["ti"], "try_number", 1) > 1,
        )

    def task_end_spec(self, context: Context, ref: Mapping[str, Any]) -> TaskEndSpec | None:
        """What ends this task on the triggerer once its job has ended (`task_end`): the job's
        end alone (its record); None: the task resumes on a worker."""
        return TaskEndSpec("job")

    def after_start(self, context: Context, submitted: Submitted) -> None:
        """Called once a job was started or adopted, before the task defers."""

    # --- the lifecycle ----------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        request = self.request(context)
        planned: Mapping[str, Any] | None = None
        try:
            planned = self.driver.planned_ref(request)
            if planned is not None:  # recorded before the submit: see `JobDriver.planned_ref`
                self.record(context, planned, None, "pending")
            submitted = self.driver.submit_or_adopt(request, self.log)
        except Exception as exc:
            if planned is not None:  # nothing of ours to cancel: a retry adopts what landed
                self.record(context, planned, False, f"not created or adopted: {exc}")
            if isinstance(exc, AirflowException):
                raise
            raise AirflowException(f"{request.label}: {exc}") from exc  # one line; retries apply
        self.record(context, submitted.ref, None, "running")
        if submitted.line:
            self.log.info("%s", submitted.line)
        if submitted.ended is not None:
            # It ended with success before this try: its outcome now, no deferral (a trigger
            # that fires at once is what Airflow's scheduler race needs, docs/slurm.md).
            return self.job_ended(context, submitted.ref, submitted.ended, {})
        self.after_start(context, submitted)
        self.watch(context, submitted, {})

    def watch(
        self,
        context: Context,
        submitted: Submitted,
        budget: Mapping[str, int],
        method_name: str = "execute_complete",
        *,
        waiting_only: bool = False,
    ) -> None:
        """Own the job of `submitted` and defer to its watch until it fires (the trigger may
        end the task itself: `task_end_spec`); `waiting_only`: a job this task only waits for,
        never owned, never ending the task."""
        ref = submitted.ref
        end = None if waiting_only else self.task_end_spec(context, ref)
        if not waiting_only:
            self._owned = ref
        self.defer(
            trigger=self.trigger(ref, submitted.memo, budget, end),
            method_name=method_name,
            timeout=self.driver.defer_timeout(self.job_timeout, submitted.memo),
        )

    def trigger(
        self,
        ref: Mapping[str, Any],
        memo: Mapping[str, Any],
        budget: Mapping[str, int],
        end: TaskEndSpec | None,
    ) -> WatchTrigger:
        d = self.driver
        run_dir = self.stop_run_dir if isinstance(self.stop_run_dir, str) else None
        return WatchTrigger(
            driver=d.name,
            driver_args=d.args(),
            ref=dict(ref),
            memo=dict(memo),
            budget=dict(budget),
            poll_interval_s=d.poll_interval_s,
            outage_budget_s=d.outage_budget_s,
            backoff_max_s=d.backoff_max_s,
            stop_run_dir=run_dir,
            stop_grace_s=self.stop_grace.total_seconds(),
            settle_s=settle_default() if d.quick_jobs else 0.0,
            task_end=None if end is None else end.kwargs(),
        )

    def record(
        self, context: Context, ref: Mapping[str, Any], cancel: bool | None, why: str
    ) -> None:
        """Record the job of `ref` and what the teardown does with it (`teardown`)."""
        value = {**ref, RECORD_DECISION: cancel, "why": why}
        context["ti"].xcom_push(key=JOB_RECORD_KEY, value=value)

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> Any:
        ref = dict(event["ref"])
        self._owned = ref
        where, phase = self.driver.describe(ref), event["phase"]
        if phase == WATCHING:
            if event["message"]:
                self.log.warning("%s: %s", where, event["message"])
            kwargs = event["kwargs"]
            self.defer(
                trigger=WatchTrigger(**kwargs),
                method_name="execute_complete",
                timeout=self.driver.defer_timeout(self.job_timeout, kwargs["memo"]),
            )
        if phase == STOPPED:
            # the verdict was decided; what the job committed before is what the run has
            self.record(context, ref, True, "stopped after the run's stop request")
            self.log.warning("%s cancelled: %s", where, event["message"])
            return {**ref, "outcome": "stopped", "exit_code": None, "restarts": event["budget"]}
        return self.job_ended(context, ref, JobState.from_json(event["state"]), event["budget"])

    def job_ended(
        self,
        context: Context,
        ref: Mapping[str, Any],
        state: JobState,
        budget: Mapping[str, int],
    ) -> Any:
        """The task's outcome for the job's end `state`: its return value, or an exception;
        a restart outcome starts the job again (within the driver's `max_restarts`)."""
        where, outcome = self.driver.describe(ref), state.outcome
        said = f"{where}: {state.line}"
        counted, uncounted = int(budget.get("counted", 0)), int(budget.get("uncounted", 0))
        if outcome == "succeeded":
            self.record(context, ref, True, "succeeded")
            self.log.info("%s", said)
            return {
                **ref, "outcome": outcome, "exit_code": state.exit_code,
                "restarts": {"counted": counted, "uncounted": uncounted},
            }  # fmt: skip
        if outcome == "foreign":
            self._owned = None
            self.record(context, ref, False, "replaced by another object of that name")
            raise JobReplacedError(said)
        if outcome == "lost":
            self.record(context, ref, False, f"watch error: {state.line}")
            raise AirflowException(
                f"{said}; the job is left as it is: a retry (or clearing the task) adopts it "
                "if it still runs, else starts it again"
            )
        if outcome in ("restart", "restart_uncounted"):
            limit = self.driver.max_restarts(self.role)
            if outcome == "restart" and counted >= limit:
                self.record(context, ref, True, "failed, no restart left")
                raise AirflowFailException(
                    f"{said}; no restart left ({counted} of max_restarts={limit} used)"
                    f"{self._tail(ref, state)}"
                )
            budget = {
                "counted": counted + (outcome == "restart"),
                "uncounted": uncounted + (outcome == "restart_uncounted"),
            }
            self.record(context, ref, True, f"restarted: {state.line}")
            new = self.driver.restart(self.request(context), self.log)
            self.log.warning(
                "%s; started again: %s (restarts: %d counted of %d, %d uncounted)",
                said, self.driver.describe(new.ref), budget["counted"], limit,
                budget["uncounted"],
            )  # fmt: skip
            self.record(context, new.ref, None, "running")
            self.watch(context, new, budget)
        self.record(context, ref, True, f"{outcome}: {state.line}")
        message = f"{said}{''.join(f'{chr(10)}  {line}' for line in state.detail)}"
        if outcome == "failed":  # a retry of the task runs it again
            raise AirflowException(f"{message}{self._tail(ref, state)}")
        if outcome == "cancelled":
            raise AirflowFailException(f"{message}: cancelled by someone else")
        raise AirflowFailException(
            f"{message}; not restarted: a rerun would end the same way (docs/exit-codes.md; "
            f"clear the task to run it again){self._tail(ref, state)}"
        )

    def _tail(self, ref: Mapping[str, Any], state: JobState) -> str:
        try:
            tail = self.driver.output_tail(ref, state)
        except Exception as exc:
            return f"\n(its output was not read: {exc})"
        return f"\nlast output lines:\n{tail}" if tail else ""

    def on_kill(self) -> None:
        """The task is killed (marked by hand, a timeout): cancel the job it owns."""
        if self._owned is not None:
            cancelled = self.driver.cancel(self._owned)
            self.log.warning(
                "killed: %s %s", self.driver.describe(self._owned),
                "cancelled" if cancelled else "was already gone",
            )  # fmt: skip


def argv_of(value: Sequence[str] | XComArg, what: str, *, nonempty: bool = False) -> list[str]:
    """A job's argument list as the task got it (an XComArg resolved)."""
    if isinstance(value, str) or not isinstance(value, Sequence) or (nonempty and not value):
        some = "a non-empty" if nonempty else "a"
        raise ValueError(f"{what} must be {some} list of strings, got {value!r}")
    return [str(item) for item in value]
