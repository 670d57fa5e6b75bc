"""The one watch trigger (`WatchTrigger`), for every driver: read the job through its driver
(named by its registered name, rebuilt from its JSON args: `protocol.driver_type`), copy its
new output lines into the task log, cancel it `stop_grace_s` after the run's stop request, ride
out a cluster that does not answer, and end with one event format (`WatchTrigger.event`).

The whole state of a watch is its kwargs (the job's reference, the driver's memo, the restart
budget, the clocks), so every change a triggerer restart must not lose ends it with a
`WATCHING` event carrying them, the operator defers again with them and the next triggerer
goes on where it was. One change is kept in memory instead: the first sighting of the stop
request (`stop_seen`). A trainer honours the request within a step, so its job may end seconds
after the sighting, and a re-defer just before a job's end is what Airflow's deferral race
takes the task for (docs/slurm.md); a triggerer restart in the grace starts the grace again
from the next sighting (at most one grace more), and any later `WATCHING` event carries it.
Once the job has ended, a trigger given a `task_end` ends its task itself where the outcome is
final (`end_of_task`, `tasks.backend_api.task_end`): no worker resumes it, so that race cannot
take it.

A cluster that does not answer never fails the task: failed reads are retried, the wait
doubling from the poll interval up to the driver's backoff ceiling, and after the outage
budget of failed reads the trigger ends with a `WATCHING` event (reason `UNREACHABLE`, the task
log says so) and the next one goes on. The loop's clock is `wall_clock` (wall time: it
must mean the same in another triggerer process); a test replaces `_now` and `_sleep` here with
a simulated clock to run a long outage in no time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from rcpflow.verdict.stop_request import current
from tasks.backend_api.job_state import JobState
from tasks.backend_api.lifecycle_names import (
    ENDED,
    STATE_CHANGED,
    STOP_GRACE,
    STOP_REQUEST,
    STOPPED,
    UNREACHABLE,
    WATCHING,
)
from tasks.backend_api.protocol import driver_type
from tasks.backend_api.task_end import JobEnded, JobOutcome, TaskEndSpec, end_task

if TYPE_CHECKING:
    from tasks.backend_api.protocol import JobDriver

_now = time.time
_sleep = asyncio.sleep

# The least time between a trigger's start and its event, for a driver whose jobs can end
# within seconds (`JobDriver.quick_jobs`): an event that comes sooner can reach the scheduler
# before the executor's report that the deferring try has ended, and Airflow 3.3 then fails
# the task ("finished with state success, but the task instance's state attribute is queued";
# docs/slurm.md, "A verdict lost to Airflow's deferral race"). Not waited when the trigger
# ends the task itself (nothing resumes).
SETTLE_S = 5.0

# How an outcome ends a task from the triggerer: the rest need a worker (a restart to
# submit, a failure without retries, a job left as it is).
_ENDED_BY_TRIGGER: Mapping[str, JobEnded] = {"succeeded": "succeeded", "failed": "failed"}


def settle_default() -> float:
    """A quick driver's trigger's `settle_s` when none is given: `SETTLE_S` as it is now (a
    test without a scheduler sets it to 0)."""
    return SETTLE_S


def wall_clock() -> float:
    """The watch's clock, for an operator's initial state too (a test's simulated clock)."""
    return _now()


def load_driver(name: str, args: Mapping[str, Any]) -> JobDriver:
    """The driver registered as `name` (`protocol.driver_type`), rebuilt from its `args`."""
    return driver_type(name).from_args(args)


@dataclass(kw_only=True, eq=False, repr=False)
class WatchTrigger(BaseTrigger):
    """Watch the job `ref` of the driver `driver` (built from `driver_args`) every
    `poll_interval_s` until it has ended or the stop request's grace has passed; one event
    (`event`): ``{"phase", "reason", "message", "ref", "state", "budget", "kwargs"}`` with
    phase `ENDED` (`state`: `JobState.as_json`), `STOPPED` (cancelled) or `WATCHING` (defer
    again with `kwargs`). `memo` is the driver's own watch state, `budget` the operator's
    restart count, carried through; `stop_seen` and `outage_since` are the loop's clocks."""

    driver: str
    driver_args: Mapping[str, Any]
    ref: Mapping[str, Any]
    poll_interval_s: float
    outage_budget_s: float = 600.0
    backoff_max_s: float = 120.0
    memo: dict[str, Any] = field(default_factory=dict)
    budget: Mapping[str, int] = field(default_factory=dict)
    stop_run_dir: str | None = None
    stop_grace_s: float = STOP_GRACE.total_seconds()
    stop_seen: float | None = None
    outage_since: float | None = None
    # The least seconds from the trigger's start to its event (`SETTLE_S`, quick drivers).
    settle_s: float = 0.0
    # What ends the task once the job has ended (`task_end.TaskEndSpec.kwargs`), on the
    # triggerer, so that no worker resumes it (`task_end`); None: the task resumes with the event.
    task_end: dict[str, Any] | None = None
    _line: str = field(default="", init=False)  # the last state line logged (`log_state`)
    _driver: JobDriver | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        super().__init__()
        self.driver_args, self.ref = dict(self.driver_args), dict(self.ref)
        self.memo, self.budget = dict(self.memo), dict(self.budget)

    def kwargs(self) -> dict[str, Any]:
        """What this trigger is made of, its state included (JSON)."""
        fields = dataclasses.fields(self)
        return {f.name: getattr(self, f.name) for f in fields if f.init}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        # `lifecycle_names.WATCH_TRIGGER` pins the path.
        return f"{type(self).__module__}.{type(self).__qualname__}", self.kwargs()

    async def job_driver(self) -> JobDriver:
        """The driver, built on first use (in a thread: a driver's module may import its
        cluster's client, seconds in a triggerer, and no other watch of the loop waits)."""
        if self._driver is None:
            self._driver = await asyncio.to_thread(load_driver, self.driver, self.driver_args)
        return self._driver

    def where(self) -> str:
        """The job as the log names it (the driver's `describe`; `run` has built the driver
        before it asks)."""
        if self._driver is None:
            self._driver = load_driver(self.driver, self.driver_args)
        return self._driver.describe(self.ref)

    def event(
        self, phase: str, *, reason: str = "", message: str = "", state: JobState | None = None
    ) -> dict[str, Any]:
        """An event's payload; `WATCHING` carries the kwargs to defer again with."""
        return {
            "phase": phase,
            "reason": reason,
            "message": message,
            "ref": dict(self.ref),
            "state": None if state is None else state.as_json(),
            "budget": dict(self.budget),
            "kwargs": self.kwargs() if phase == WATCHING else None,
        }

    async def stop_request(self, where: str) -> str | None:
        """Look for a stop request of `stop_run_dir` (None: none is looked for) until one is
        seen (`stop_seen`, kept in memory: the module doc); the reason to end the job when it
        still runs `stop_grace_s` after it, else None."""
        run_dir = self.stop_run_dir
        if run_dir is None:
            return None
        if self.stop_seen is None:
            request = await asyncio.to_thread(current, run_dir)
            if request is not None:
                self.stop_seen = _now()
                self.log.info("%s: stop requested: %s", where, request.reason)
        if self.stop_seen is not None and _now() - self.stop_seen >= self.stop_grace_s:
            return f"still running {self.stop_grace_s:.0f} s after the stop request"
        return None

    def log_state(self, where: str, state: JobState) -> None:
        """Say the job's new output lines, and its state when its line changed since the last
        read, in the task log."""
        for line in state.output:
            self.log.info("%s | %s", where, line)
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

    def job_outcome(self, payload: Mapping[str, Any]) -> JobOutcome | None:
        """How the job ended, from this trigger's final event `payload`, in the terms of
        `task_end`; None when the task must resume with it (`WATCHING`)."""
        where = self.where()
        if payload["phase"] == STOPPED:
            return JobOutcome(self.ref, "stopped", f"{where} cancelled: {payload['message']}")
        if payload["phase"] != ENDED:
            return None
        state = JobState.from_json(payload["state"])
        ended = _ENDED_BY_TRIGGER.get(state.outcome or "", "other")
        return JobOutcome(self.ref, ended, f"{where}: {state.line}")

    async def end_of_task(self, event: TriggerEvent) -> TriggerEvent | None:
        """The event that ends the task on the triggerer after `event` (`task_end`), or None:
        the task resumes with `event` (it watches on, the outcome needs a worker, no
        `task_end` was given, or no triggerer runs this trigger: ``dag.test()``)."""
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
        driver = await self.job_driver()
        where = self.where()
        errors, failing_since = 0, None  # this trigger's own, for its budget
        while True:
            try:
                state = await driver.read(self.ref, self.memo, _now())
            except Exception as exc:
                now = _now()
                errors += 1
                failing_since = now if failing_since is None else failing_since
                if self.outage_since is None:
                    self.outage_since = failing_since
                down_s, budget_s = now - failing_since, self.outage_budget_s
                self.log.warning(
                    "%s: read %d failed (%s failing for %.0fs; the watch goes on): %r",
                    where, errors, driver.cluster_word, now - self.outage_since, exc,
                )  # fmt: skip
                if down_s >= budget_s:
                    message = (
                        f"the {driver.cluster_word} has failed every read for "
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
                    where, driver.cluster_word, _now() - self.outage_since,
                )  # fmt: skip
            errors, failing_since, self.outage_since = 0, None, None
            self.log_state(where, state)
            if state.ended:
                yield TriggerEvent(self.event(ENDED, state=state))
                return
            stop = await self.stop_request(where)
            if stop is not None:
                try:
                    await asyncio.to_thread(driver.cancel, self.ref)
                except Exception as exc:  # the cluster did not answer: the next poll tries again
                    self.log.warning("%s: %s: the cancel failed (%r); again", where, stop, exc)
                    await _sleep(self.poll_interval_s)
                    continue
                self.log.warning("%s: %s: cancelled", where, stop)
                yield TriggerEvent(self.event(STOPPED, reason=STOP_REQUEST, message=stop))
                return
            if state.changed:  # persisted by the operator's next defer (not a stop's sighting)
                yield TriggerEvent(self.event(WATCHING, reason=STATE_CHANGED))
                return
            await _sleep(self.poll_interval_s)
