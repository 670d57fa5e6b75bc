"""`SlurmJobTrigger`: follow one Slurm job on the triggerer until it has ended.

Its state is in its kwargs (the job's id, name and submit time, the restart budgets used, the
clocks: stop request seen, cluster failing since, output read up to), and every change of the
clocks ends it with a ``watching`` event whose kwargs the operator defers again with, so that a
triggerer restart goes on where it was. A cluster that does not answer (slurmctld restarting,
the SSH link down, slurmrestd away) never fails the task: the watch backs off, says so in the
task log every `outage_report_s`, and goes on. Every cluster call goes through
`tasks.backends.slurm.hooks.AsyncSlurmHook`, imported when the trigger runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import TriggerEvent

from tasks.backend_api.watch_trigger import WatchTrigger

if TYPE_CHECKING:
    from tasks.backends.slurm.hooks import AsyncSlurmHook, JobInfo
    from tasks.backends.slurm.settings import SlurmSettings

_now = time.time
_sleep = asyncio.sleep
# The least time between a trigger's start and its event: an event that comes sooner can reach
# the scheduler before the executor's report that the deferring try has ended, and Airflow
# 3.3 then fails the task ("finished with state success, but the task instance's state
# attribute is queued"), seen in `make demo BACKEND=slurm`.
SETTLE_S = 5.0

FINISHED = "finished"
WATCHING = "watching"
STOPPED = "stopped"
ERROR = "error"
# Reasons of an error event.
REUSED = "JobIdReused"
FORGOTTEN = "JobForgotten"
_CONNECTION_FIELDS = ("transport", "ssh_conn_id", "rest_url", "rest_conn_id", "command_timeout_s")


def connection_kwargs(settings: SlurmSettings) -> dict[str, Any]:
    """How the trigger reaches the cluster (JSON): the settings' transport fields."""
    return {name: getattr(settings, name) for name in _CONNECTION_FIELDS}


def wall_clock() -> float:
    return _now()


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
    outage_report_s: float = 600.0
    stop_run_dir: str | None = None
    stop_grace_s: float = 600.0
    stop_seen: float | None = None
    outage_since: float | None = None
    output_offset: int = 0
    stdout_path: str = ""
    _hook: AsyncSlurmHook | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.connection = dict(self.connection)
        self.job = dict(self.job)
        self.budget = dict(self.budget or {})

    def hook(self) -> AsyncSlurmHook:
        if self._hook is None:
            from tasks.backends.slurm.hooks import AsyncSlurmHook, slurm_hook
            from tasks.backends.slurm.settings import SlurmSettings

            settings = SlurmSettings(working_dir="/", log_dir="/", **self.connection)
            self._hook = AsyncSlurmHook(slurm_hook(settings))
        return self._hook

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from tasks.backends.slurm.hooks import SubmittedJob

        expected = SubmittedJob(**self.job)
        where = f"Slurm job {expected.job_id} ({expected.name})"
        errors, last_line, reported = 0, "", _now()
        async for event in self._watch(expected, where, errors, last_line, reported):
            wait = SETTLE_S - (_now() - reported)
            if wait > 0:
                await _sleep(wait)
            yield event
            return

    async def _watch(
        self, expected: Any, where: str, errors: int, last_line: str, reported: float
    ) -> AsyncIterator[TriggerEvent]:
        from tasks.backends.slurm.hooks import JobForgotten, JobIdReused

        while True:
            try:
                info = await self.hook().job(expected.job_id, expected)
            except JobIdReused as exc:
                yield TriggerEvent(self._event(ERROR, reason=REUSED, message=str(exc)))
                return
            except JobForgotten as exc:
                yield TriggerEvent(self._event(ERROR, reason=FORGOTTEN, message=str(exc)))
                return
            except Exception as exc:  # the cluster did not answer: never a reason to fail
                now = _now()
                errors += 1
                if self.outage_since is None:
                    self.outage_since = now
                down = now - self.outage_since
                self.log.warning(
                    "%s: read %d failed (cluster failing for %.0f s; the watch goes on): %s",
                    where, errors, down, exc,
                )  # fmt: skip
                if now - reported >= self.outage_report_s:
                    message = (
                        f"the cluster has not answered for {down:.0f} s (last: {exc}); the job "
                        "is left as it is and the watch goes on"
                    )
                    yield TriggerEvent(self._event(WATCHING, reason="Unreachable", message=message))
                    return
                await _sleep(min(self.backoff_max_s, self.poll_interval_s * 2 ** (errors - 1)))
                continue
            changed = False
            if self.outage_since is not None:
                self.log.info(
                    "%s: the cluster answers again after %.0f s", where, _now() - self.outage_since
                )
                self.outage_since, errors, changed = None, 0, True
            if info.stdout_path:  # kept across a re-defer, never a reason for one
                self.stdout_path = info.stdout_path
            await self._show_output(where)
            line = f"{info.state} on {info.nodes or '(no nodes yet)'}" + (
                f", Slurm restart {info.restarts}" if info.restarts else ""
            )
            if line != last_line:
                self.log.info("%s: %s", where, line)
                last_line = line
            if info.finished:
                await self._show_output(where)
                yield TriggerEvent(self._event(FINISHED, info=info))
                return
            seen, stop = await self.stop_request(where, _now)
            changed = changed or seen
            if stop is not None:
                await self.hook().cancel(expected.job_id)
                self.log.warning("%s: %s: scancelled", where, stop)
                yield TriggerEvent(self._event(STOPPED, reason="StopRequest", message=stop))
                return
            if changed:
                yield TriggerEvent(self._event(WATCHING, reason="StateChanged"))
                return
            await _sleep(self.poll_interval_s)

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

    def _event(
        self, phase: str, *, reason: str = "", message: str = "", info: JobInfo | None = None
    ) -> dict[str, Any]:
        return {
            "phase": phase,
            "reason": reason,
            "message": message,
            "job": self.job,
            "budget": self.budget,
            "info": None if info is None else asdict(info),
            "kwargs": self.kwargs() if phase == WATCHING else None,
        }
