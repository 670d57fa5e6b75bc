"""The watch loop every cluster backend's trigger runs (`WatchTrigger`): read the job, let the
backend say whether it ended, cancel it `stop_grace_s` after the run's stop request, and ride
out a cluster that does not answer. The whole state of a watch is its kwargs, so every change
ends it with a `WATCHING` event carrying them, the operator defers again with them and a
triggerer restart goes on where it was. One change is kept in memory instead: the first
sighting of the stop request (`stop_seen`). A trainer honours the request within a step, so
its job may end seconds after the sighting, and a re-defer just before a job's end is what
Airflow's deferral race takes the task for (docs/slurm.md); a triggerer restart in the grace
starts the grace again from the next sighting (at most one grace more), and any later
`WATCHING` event carries it. Once the job has ended, a trigger given a `task_end` ends its task
itself where the backend's `job_outcome` says the outcome is final (`end_of_task`,
`tasks.backend_api.task_end`): no worker resumes it, so that race cannot take it.

A cluster that does not answer never fails the task: failed reads are retried, the wait
doubling from the poll interval up to the backend's backoff ceiling, and after the outage
budget of failed reads the trigger ends with a `WATCHING` event (reason `UNREACHABLE`, the task
log says so) and the next one goes on. The loop's clock is `wall_clock` (wall time: it
must mean the same in another triggerer process); a test replaces `_now` and `_sleep` here with
a simulated clock to run a long outage in no time."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from rcpflow.verdict.stop_request import current
from tasks.backend_api.job_state import JobState
from tasks.backend_api.lifecycle_names import (
    STATE_CHANGED,
    STOP_GRACE,
    STOP_REQUEST,
    STOPPED,
    UNREACHABLE,
    WATCHING,
)
from tasks.backend_api.task_end import JobOutcome, TaskEndSpec, end_task

_now = time.time
_sleep = asyncio.sleep

# The least time between a trigger's start and its event, for a backend whose job can end
# within seconds (`WatchTrigger.settle_s`): an event that comes sooner can reach the scheduler
# before the executor's report that the deferring try has ended, and Airflow 3.3 then fails
# the task ("finished with state success, but the task instance's state attribute is queued";
# docs/slurm.md, "A verdict lost to Airflow's deferral race").
SETTLE_S = 5.0


def settle_default() -> float:
    """A settling trigger's `settle_s` when none is given: `SETTLE_S` as it is now (a test
    without a scheduler sets it to 0)."""
    return SETTLE_S


def wall_clock() -> float:
    """The watch's clock, for an operator's initial state too (a test's simulated clock)."""
    return _now()


@dataclass(kw_only=True, eq=False, repr=False)
class WatchTrigger(BaseTrigger):
    """Base of a watch trigger; a subclass is a dataclass too (``kw_only=True, eq=False,
    repr=False``): its fields and these are its kwargs (the constructor's arguments); a field
    with ``init=False`` is the trigger's own (a hook), never part of them. The backend supplies
    `poll_interval_s`'s default and the adapter methods below `run`; the loop is this class's.
    `stop_seen` and `outage_since` are the loop's clocks (`run`)."""

    poll_interval_s: float
    # Seconds of failed reads after which the trigger re-defers (`UNREACHABLE`), and the longest
    # wait between failed reads (a backend's subclass gives its own defaults).
    outage_budget_s: float = 600.0
    backoff_max_s: float = 120.0
    stop_run_dir: str | None = None
    stop_grace_s: float = STOP_GRACE.total_seconds()
    stop_seen: float | None = None
    outage_since: float | None = None
    # What ends the task once the job has ended (`task_end.TaskEndSpec.kwargs`), on the
    # triggerer, so that no worker resumes it (`task_end`); None: the task resumes with the event.
    task_end: dict[str, Any] | None = None
    _line: str = field(default="", init=False)  # the last state line logged (`log_state`)
    # Said in the log and the outage message: what failed to answer.
    cluster_word: ClassVar[str] = "cluster"
    # The least seconds from the trigger's start to its event: 0 unless a backend's jobs can
    # end within seconds (then a field of the subclass defaulting to `settle_default()`; not
    # a field here, so that it is no kwarg of a trigger that does not settle).
    settle_s = 0.0

    def __post_init__(self) -> None:
        super().__init__()

    def kwargs(self) -> dict[str, Any]:
        """What this trigger is made of, its state included (JSON)."""
        fields = dataclasses.fields(self)
        return {f.name: getattr(self, f.name) for f in fields if f.init}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        # The subclass's module path (`lifecycle_names` pins it); plugins.jobset keeps the path
        # of older releases importable.
        return f"{type(self).__module__}.{type(self).__qualname__}", self.kwargs()

    async def stop_request(self, where: str, now: Callable[[], float]) -> str | None:
        """Look for a stop request of `stop_run_dir` (None: none is looked for) until one is
        seen (`stop_seen`, kept in memory: the module doc); the reason to end the job when it
        still runs `stop_grace_s` after it, else None. `now` is the trigger's clock."""
        run_dir = self.stop_run_dir
        if run_dir is None:
            return None
        if self.stop_seen is None:
            request = await asyncio.to_thread(current, run_dir)
            if request is not None:
                self.stop_seen = now()
                self.log.info("%s: stop requested: %s", where, request.reason)
        if self.stop_seen is not None and now() - self.stop_seen >= self.stop_grace_s:
            return f"still running {self.stop_grace_s:.0f} s after the stop request"
        return None

    def log_state(self, where: str, state: JobState) -> None:
        """Say the job's state in the task log when its line changed since the last read."""
        if state.line != self._line:
            self.log.info("%s: %s", where, state.line)
            self._line = state.line

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started = _now()
        async for event in self._watch():
            ending = await self.end_of_task(event)
            if ending is not None:  # no worker resumes the task: nothing to settle
                yield ending
                return
            wait = self.settle_s - (_now() - started)
            if wait > 0:
                await _sleep(wait)
            yield event
            return

    async def end_of_task(self, event: TriggerEvent) -> TriggerEvent | None:
        """The event that ends the task on the triggerer after `event` (`task_end`), or None:
        the task resumes with `event` (it watches on, this backend does not say how its job
        ended, no `task_end` was given, or no triggerer runs this trigger: ``dag.test()``)."""
        spec = TaskEndSpec.from_kwargs(self.task_end)
        if spec is None or self.task_instance is None:
            return None
        outcome = self.job_outcome(event.payload)
        if outcome is None:
            return None
        end = await asyncio.to_thread(end_task, spec, outcome)
        if end is None:
            return None
        if end.state == "failed":
            self.log.error("%s", end.line)
        else:
            self.log.info("%s", end.line)
        return end.event()

    async def _watch(self) -> AsyncIterator[TriggerEvent]:
        where = self.where()
        errors, failing_since = 0, None  # this trigger's own, for its budget
        while True:
            try:
                state = await self.read()
            except Exception as exc:
                final = self.read_failed(exc)
                if final is not None:
                    yield TriggerEvent(final)
                    return
                now = _now()
                errors += 1
                failing_since = now if failing_since is None else failing_since
                if self.outage_since is None:
                    self.outage_since = failing_since
                down_s, budget_s = now - failing_since, self.outage_budget_s
                self.log.warning(
                    "%s: read %d failed (%s failing for %.0fs; the watch goes on): %r",
                    where, errors, self.cluster_word, now - self.outage_since, exc,
                )  # fmt: skip
                if down_s >= budget_s:
                    message = (
                        f"the {self.cluster_word} has failed every read for "
                        f"{now - self.outage_since:.0f}s (last: {exc!r}); the job is left as it "
                        "is and the watch goes on"
                    )
                    yield TriggerEvent(self.event(WATCHING, reason=UNREACHABLE, message=message))
                    return
                backoff = min(self.backoff_max_s, self.poll_interval_s * 2 ** (errors - 1))
                # The last wait ends at the budget, so re-deferring is neither early nor late.
                await _sleep(min(backoff, budget_s - down_s))
                continue
            # The end of an outage is no change to persist: `outage_since` only dates a report.
            if self.outage_since is not None:
                self.log.info(
                    "%s: the %s answers again after %.0fs",
                    where, self.cluster_word, _now() - self.outage_since,
                )  # fmt: skip
            errors, failing_since, self.outage_since = 0, None, None
            ended, state_changed = await self.observe(state, where, _now())
            if ended is not None:
                yield TriggerEvent(ended)
                return
            stop = await self.stop_request(where, _now)
            if stop is not None:
                await self.cancel()
                self.log.warning("%s: %s: cancelled", where, stop)
                yield TriggerEvent(self.event(STOPPED, reason=STOP_REQUEST, message=stop))
                return
            if state_changed:  # persisted by the operator's next defer (not a stop's sighting)
                yield TriggerEvent(self.event(WATCHING, reason=STATE_CHANGED))
                return
            await _sleep(self.poll_interval_s)

    # --- the backend's adapter --------------------------------------------------------------

    def where(self) -> str:
        """The job as the log names it."""
        raise NotImplementedError

    async def read(self) -> Any:
        """The job's state from the cluster; an exception is a failed read (`read_failed`)."""
        raise NotImplementedError

    def read_failed(self, exc: Exception) -> dict[str, Any] | None:
        """The event that ends the watch for a read that failed with `exc` (the job is gone,
        another job holds its name), or None: the cluster did not answer, try again."""
        return None

    async def observe(
        self, state: Any, where: str, now: float
    ) -> tuple[dict[str, Any] | None, bool]:
        """What the watch makes of a good read: the event that ends it (the job ended, or ran
        past a bound), else None; and whether the trigger's state changed."""
        raise NotImplementedError

    async def cancel(self) -> None:
        """Cancel the job on the cluster (a stop request's grace has passed)."""
        raise NotImplementedError

    def job_outcome(self, payload: Any) -> JobOutcome | None:
        """How the job ended, from this trigger's final event `payload`; None when the task must
        resume with it (a `WATCHING` event; a backend that does not say)."""
        return None

    def event(self, phase: str, *, reason: str = "", message: str = "") -> dict[str, Any]:
        """An event's payload; `WATCHING` carries the kwargs to defer again with."""
        raise NotImplementedError
