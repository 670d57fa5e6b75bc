"""The cluster-job operator every cluster backend's run task is (`ClusterJobOperator`): it
records the job it starts (`lifecycle_names.JOB_RECORD_KEY`, the rule of `teardown`), starts it
or adopts the one an earlier try left running (the backend's `execute`), defers to the
backend's `WatchTrigger` and again on every `WATCHING` event, ends on a stop request's
`STOPPED` event, leaves the rest of the outcome to the backend (`job_ended`), and cancels what
it owns when killed (`on_kill`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator, XComArg

from tasks.backend_api.lifecycle_names import (
    JOB_RECORD_KEY,
    RECORD_DECISION,
    STOP_GRACE,
    STOPPED,
    WATCHING,
)
from tasks.backend_api.task_end import TaskEndSpec
from tasks.backend_api.watch_trigger import WatchTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


class ClusterJobOperator(BaseOperator):
    """Run one cluster job and wait for it, deferred (see the module doc). With `stop_run_dir`
    the job is cancelled `stop_grace` after a stop request of that run. The backend supplies
    `execute` (start or adopt, then `watch`), `trigger_type`, `job_ref`, `log_name`,
    `cancel_job` and `job_ended`."""

    trigger_type: ClassVar[type[WatchTrigger]]
    # How the log names the job of a reference: a format of the reference's keys (the
    # backend's teardown names it the same way, `teardown.CancelRecordedJobs.log_name`).
    log_name: ClassVar[str] = "{name}"

    def __init__(
        self,
        *,
        stop_run_dir: str | XComArg | None = None,
        stop_grace: timedelta = STOP_GRACE,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stop_run_dir = stop_run_dir
        self.stop_grace = stop_grace
        self._owned: Mapping[str, Any] | None = None

    # --- the backend's adapter --------------------------------------------------------------

    def job_ref(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """The reference of the job an event is about (what the record keeps)."""
        raise NotImplementedError

    def where(self, ref: Mapping[str, Any]) -> str:
        """The job of `ref` as the log names it (`log_name`)."""
        return self.log_name.format_map(ref)

    def cancel_job(self, ref: Mapping[str, Any]) -> bool:
        """Cancel the job of `ref`; False when it was gone already."""
        raise NotImplementedError

    def job_ended(self, context: Context, ref: Mapping[str, Any], event: Mapping[str, Any]) -> Any:
        """The task's outcome for any event but `WATCHING` and `STOPPED`: its return value, or
        an exception; records the decision (`record`)."""
        raise NotImplementedError

    def stopped(self, ref: Mapping[str, Any], event: Mapping[str, Any]) -> Any:
        """The task's return value when the job was cancelled after the stop request."""
        return dict(ref)

    def task_end_spec(self, context: Context, ref: Mapping[str, Any]) -> TaskEndSpec | None:
        """What ends this task on the triggerer once its job has ended (`task_end`; a backend's
        trigger that says how its job ended takes it): by default the job's end alone (its
        record); None: the task resumes on a worker."""
        return TaskEndSpec("job")

    def defer_timeout(self, trigger: WatchTrigger) -> timedelta | None:
        """Airflow's deferral timeout, an outer net behind the trigger's own bounds."""
        return None

    # --- the lifecycle ----------------------------------------------------------------------

    def stop_kwargs(self) -> dict[str, Any]:
        """The trigger's stop request kwargs (a run folder that was an XComArg is resolved)."""
        run_dir = self.stop_run_dir if isinstance(self.stop_run_dir, str) else None
        return {"stop_run_dir": run_dir, "stop_grace_s": self.stop_grace.total_seconds()}

    def record(
        self, context: Context, ref: Mapping[str, Any], cancel: bool | None, why: str
    ) -> None:
        """Record the job of `ref` and what the teardown does with it (`teardown`)."""
        value = {**ref, RECORD_DECISION: cancel, "why": why}
        context["ti"].xcom_push(key=JOB_RECORD_KEY, value=value)

    def watch(
        self, ref: Mapping[str, Any], trigger: WatchTrigger, method_name: str = "execute_complete"
    ) -> None:
        """Own the job of `ref` and defer to `trigger` until it fires."""
        self._owned = ref
        self.defer(trigger=trigger, method_name=method_name, timeout=self.defer_timeout(trigger))

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> Any:
        ref = self.job_ref(event)
        self._owned = ref
        where, phase = self.where(ref), event["phase"]
        if phase == WATCHING:
            if event["message"]:
                self.log.warning("%s: %s", where, event["message"])
            self.watch(ref, self.trigger_type(**event["kwargs"]))
        if phase == STOPPED:
            # the verdict was decided; what the job committed before is what the run has
            self.record(context, ref, True, "stopped after the run's stop request")
            self.log.warning("%s cancelled: %s", where, event["message"])
            return self.stopped(ref, event)
        return self.job_ended(context, ref, event)

    def on_kill(self) -> None:
        """The task is killed (marked by hand, a timeout): cancel the job it owns."""
        if self._owned is not None:
            cancelled = self.cancel_job(self._owned)
            self.log.warning(
                "killed: %s %s", self.where(self._owned),
                "cancelled" if cancelled else "was already gone",
            )  # fmt: skip


def argv_of(value: Sequence[str] | XComArg, what: str, *, nonempty: bool = False) -> list[str]:
    """A job's argument list as the task got it (an XComArg resolved)."""
    if isinstance(value, str) or not isinstance(value, Sequence) or (nonempty and not value):
        some = "a non-empty" if nonempty else "a"
        raise ValueError(f"{what} must be {some} list of strings, got {value!r}")
    return [str(item) for item in value]
