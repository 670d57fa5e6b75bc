"""`SlurmJobTrigger`: follow one Slurm job on the triggerer until it has ended: the Slurm
adapter of the shared watch loop (`tasks.backend_api.watch_trigger.WatchTrigger`: outage
budget, backoff, clock, stop request, re-deferral).

Its state is in its kwargs (the job's id, name and submit time, the restart budgets used, the
clocks: stop request seen, cluster failing since, output read up to), and every change of the
clocks ends it with a ``watching`` event whose kwargs the operator defers again with, so that a
triggerer restart goes on where it was. A cluster that does not answer (slurmctld restarting,
the SSH link down, slurmrestd away) never fails the task: the watch backs off, says so in the
task log every `outage_budget_s`, and goes on. Every cluster call goes through
`tasks.backends.slurm.hooks.AsyncSlurmHook`, imported when the trigger runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tasks.backend_api.lifecycle_names import ERROR, STOPPED, WATCHING
from tasks.backend_api.task_end import JobEnded, JobOutcome
from tasks.backend_api.watch_trigger import WatchTrigger, settle_default
from tasks.backends.slurm.adapter import cancel_step_job, job_state

if TYPE_CHECKING:
    from tasks.backends.slurm.hooks import AsyncSlurmHook, JobInfo
    from tasks.backends.slurm.settings import SlurmJobShape, SlurmSettings

# The phase of the event of a job that ended (`info`: the job as Slurm reported it last).
FINISHED = "finished"
# Reasons of an error event.
REUSED = "JobIdReused"
FORGOTTEN = "JobForgotten"
# log_dir: the job's output file is derived from it (never read from the cluster's answer).
_CONNECTION_FIELDS = (
    "transport", "ssh_conn_id", "rest_url", "rest_conn_id", "command_timeout_s", "log_dir",
    "export_env",
)  # fmt: skip


def connection_kwargs(settings: SlurmSettings) -> dict[str, Any]:
    """How the trigger reaches the cluster (JSON): the settings' transport fields."""
    return {name: getattr(settings, name) for name in _CONNECTION_FIELDS}


def settings_from_connection(connection: Mapping[str, Any]) -> SlurmSettings:
    """Settings enough to reach the cluster from `connection_kwargs`'s JSON (its hooks)."""
    from tasks.backends.slurm.settings import SlurmSettings as Settings

    fields = {"log_dir": "/", **connection}
    fields["export_env"] = tuple(fields.get("export_env", ()))
    return Settings(working_dir="/", **fields)


def step_cancel_args(settings: SlurmSettings, dag_id: str, run_id: str) -> dict[str, Any]:
    """What `cancel_step` needs to find the evaluation jobs of one DAG run (JSON: a trigger's
    kwargs carry it; the cluster by its connection fields)."""
    return {"connection": connection_kwargs(settings), "dag_id": dag_id, "run_id": run_id}


def cancel_step(args: Mapping[str, Any], step: int) -> bool:
    """`adapter.cancel_step_job` from `step_cancel_args`'s JSON (on the triggerer, in a thread)."""
    settings = settings_from_connection(args["connection"])
    return cancel_step_job(settings, args["dag_id"], args["run_id"], step)


def contract_kwargs(settings: SlurmSettings, shape: SlurmJobShape) -> dict[str, Any]:
    """The exit-code contract of a job of `shape` (JSON, `SlurmJobTrigger.contract`)."""
    return {
        "fail_exit_codes": list(settings.fail_exit_codes),
        "signal_grace_s": shape.signal_grace_s,
        "time_limit_s": shape.time_limit_s,
    }


@dataclass(kw_only=True, eq=False, repr=False)
class SlurmJobTrigger(WatchTrigger):
    """Poll the job `job` (``{"job_id", "name", "submit_time"}``) every `poll_interval_s`
    until it has ended; one event ``{"phase", "reason", "message", "job", "info", "budget",
    "kwargs"}``: ``finished`` (`info`: the job as Slurm reported it last), ``stopped`` (still
    running `stop_grace_s` after a stop request of `stop_run_dir`: scancelled), ``error``
    (JobIdReused, JobForgotten) or ``watching`` (defer again with `kwargs`). `budget` is the
    operator's restart count, carried through."""

    connection: Mapping[str, Any]
    job: Mapping[str, Any]
    budget: Mapping[str, int] | None = None
    poll_interval_s: float = 15.0
    backoff_max_s: float = 120.0
    outage_budget_s: float = 600.0
    output_offset: int = 0
    stdout_path: str = ""
    settle_s: float = field(default_factory=settle_default)
    # The exit-code contract of the job's shape (`contract_kwargs`): with it the trigger says
    # how the job ended (`job_outcome`), so a task can end on the triggerer.
    contract: Mapping[str, Any] | None = None
    _hook: AsyncSlurmHook | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.connection = dict(self.connection)
        self.job = dict(self.job)
        self.budget = dict(self.budget or {})

    def hook(self) -> AsyncSlurmHook:
        if self._hook is None:
            from tasks.backends.slurm.hooks import AsyncSlurmHook, slurm_hook

            self._hook = AsyncSlurmHook(slurm_hook(settings_from_connection(self.connection)))
        return self._hook

    def job_outcome(self, payload: Any) -> JobOutcome | None:
        where = self.where()
        if payload["phase"] == STOPPED:
            return JobOutcome(self.job, "stopped", f"{where} cancelled: {payload['message']}")
        if payload["phase"] != FINISHED or self.contract is None:
            return None
        from tasks.backends.slurm.hooks import JobInfo
        from tasks.backends.slurm.outcome import decide

        c = self.contract
        outcome = decide(
            JobInfo(**payload["info"]),
            tuple(c["fail_exit_codes"]),
            int(c["signal_grace_s"]),
            int(c["time_limit_s"]),
        )
        # a restart is submitted, a failure failed without retries, by the operator on a worker
        ended: JobEnded = "succeeded" if outcome.decision == "succeeded" else "other"
        return JobOutcome(self.job, ended, f"{where} ended: {outcome.why}")

    def where(self) -> str:
        return f"Slurm job {self.job['job_id']} ({self.job['name']})"

    async def read(self) -> JobInfo:
        from tasks.backends.slurm.hooks import SubmittedJob

        expected = SubmittedJob(**self.job)
        return await self.hook().job(expected.job_id, expected)

    def read_failed(self, exc: Exception) -> dict[str, Any] | None:
        from tasks.backends.slurm.hooks import JobForgotten, JobIdReused

        if isinstance(exc, JobIdReused | JobForgotten):
            reason = REUSED if isinstance(exc, JobIdReused) else FORGOTTEN
            return self.event(ERROR, reason=reason, message=str(exc))
        return None

    async def observe(
        self, info: JobInfo, where: str, now: float
    ) -> tuple[dict[str, Any] | None, bool]:
        if info.stdout_path:  # the hook's own path (log_dir), kept across a re-defer
            self.stdout_path = info.stdout_path
        await self._show_output(where)
        state = job_state(info)
        self.log_state(where, state)
        if state.ended:
            await self._show_output(where)
            return self.event(FINISHED, info=info), False
        return None, False

    async def cancel(self) -> None:
        await self.hook().cancel(str(self.job["job_id"]))

    async def _show_output(self, where: str) -> None:
        """The job's new output lines into the task log (best effort)."""
        if not self.stdout_path:
            return
        try:
            text, offset = await self.hook().read_output(self.stdout_path, self.output_offset)
        except Exception as exc:
            self.log.debug("%s: output not read: %s", where, exc)
            return
        complete = text.rfind("\n") + 1  # whole lines only; the rest is read next time
        for line in text[:complete].splitlines():
            self.log.info("%s | %s", where, line)
        self.output_offset = offset - len(text[complete:].encode())

    def event(
        self, phase: str, *, reason: str = "", message: str = "", info: JobInfo | None = None
    ) -> dict[str, Any]:
        kwargs = self.kwargs() if phase == WATCHING else None
        return event_payload(phase, self.job, self.budget or {}, reason, message, info, kwargs)


def event_payload(
    phase: str,
    job: Mapping[str, Any],
    budget: Mapping[str, int],
    reason: str = "",
    message: str = "",
    info: JobInfo | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An event of `SlurmJobTrigger` (also what the operator hands itself for a job that had
    ended before it could defer)."""
    return {
        "phase": phase,
        "reason": reason,
        "message": message,
        "job": dict(job),
        "budget": dict(budget),
        "info": None if info is None else asdict(info),
        "kwargs": None if kwargs is None else dict(kwargs),
    }
