"""`JobSetTrigger`: follow a JobSet on the triggerer until it is terminal.

Every read and delete goes through `tasks.backends.gke.hooks.AsyncJobSetHook`, imported on the
first call, so importing this module stays cheap; the cluster's endpoint is looked up through
the Google connection when the trigger starts and again after a failed read, never kept in the
trigger's kwargs.

The trigger's clocks are wall-clock instants in its kwargs (running since, suspended since,
stop request seen, API failing since) with the JobSet's UID, and every change of them ends the
trigger with a ``Watching`` event whose ``kwargs`` the operator defers again with: a triggerer
restart resumes from the last change, with every clock where it was. API trouble (apiserver
restarts, a control-plane upgrade, network loss) never fails the task: after
`api_error_budget_s` of failed reads the trigger re-defers the same way (the task log says
so) and goes on. Time spent suspended (waiting for Kueue to admit the JobSet) is bounded on its
own and does not count against the job's running time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import TriggerEvent

from tasks.backend_api.watch_trigger import WatchTrigger
from tasks.backends.gke.settings import GkeCluster
from tasks.backends.gke.status import (
    JobSetGone,
    JobSetStatusError,
    failed_pods,
    interpret_status,
)

if TYPE_CHECKING:
    from tasks.backends.gke.hooks import AsyncJobSetHook

# The clock (wall time: it must mean the same in another triggerer process) and the sleep of
# the watch loop; a test replaces both with a simulated clock to run a long outage in no time.
_now = time.time
_sleep = asyncio.sleep


def wall_clock() -> float:
    """The watch's clock, for the operator's initial state (a test's simulated clock too)."""
    return _now()


# Reasons of a Failed event for a JobSet the watch gave up on (the cluster has not failed it).
SUSPENDED_TOO_LONG = "SuspendedTooLong"
RUNNING_TOO_LONG = "RunningTooLong"
WATCH_BOUNDS = (SUSPENDED_TOO_LONG, RUNNING_TOO_LONG)
# Reason of an error event: the JobSet of that name is another object than the one created.
REPLACED = "Replaced"
# The phase of an event that asks the operator to defer again with the event's kwargs.
WATCHING = "Watching"


def cluster_kwargs(cluster: GkeCluster) -> dict[str, Any]:
    """`cluster` as JSON for the trigger's kwargs: every field (`cluster_from_kwargs` is the
    inverse)."""
    kwargs = dataclasses.asdict(cluster)
    kwargs["impersonation_chain"] = list(cluster.impersonation_chain)
    return kwargs


def cluster_from_kwargs(kwargs: Mapping[str, Any]) -> GkeCluster:
    """The cluster `cluster_kwargs` wrote."""
    return GkeCluster(**{**kwargs, "impersonation_chain": tuple(kwargs["impersonation_chain"])})


@dataclass(kw_only=True, eq=False, repr=False)
class JobSetTrigger(WatchTrigger):
    """Poll a JobSet every `poll_interval_s` until it is terminal; one event:
    ``{"phase": "Succeeded"|"Failed"|"Stopped"|"error"|"Watching", "name", "namespace",
    "reason", "message", "progress", "pods", "kwargs"}`` (`pods`: lines on the failed pods, for
    a Failed JobSet; `kwargs`: the state to defer again with, for Watching).

    A JobSet that disappears is Failed (reason NotFound); one whose UID is not `uid` (deleted
    and created again under the same name) is ``error`` with reason Replaced. Failed reads are
    retried, the wait doubling from `poll_interval_s` up to `api_backoff_max_s`; after
    `api_error_budget_s` of them without a good read: Watching. A malformed status is
    ``error``. Suspended for `max_suspended_s` in a row: Failed (reason SuspendedTooLong);
    running (not suspended) for `max_running_s` in all: Failed (reason RunningTooLong). None:
    no bound.

    With `stop_run_dir` (training under evaluation during training), a JobSet still running
    `stop_grace_s` after a stop request of that run appeared
    (`rcpflow.verdict.stop_request.current`) is deleted: phase ``Stopped``.

    State (wall-clock seconds, see the module doc): `running_s` running time before
    `running_since` (None: not running now), `suspended_since`, `stop_seen`, `outage_since`;
    `submitted_at` (when the operator created it) is kept for the operator's outer timeout.
    """

    name: str
    namespace: str
    cluster: Mapping[str, Any]
    uid: str | None = None
    poll_interval_s: float = 30.0
    api_error_budget_s: float = 1200.0
    api_backoff_max_s: float = 120.0
    max_suspended_s: float | None = None
    max_running_s: float | None = None
    stop_run_dir: str | None = None
    stop_grace_s: float = 600.0
    running_s: float = 0.0
    running_since: float | None = None
    suspended_since: float | None = None
    stop_seen: float | None = None
    outage_since: float | None = None
    submitted_at: float | None = None
    _hook: AsyncJobSetHook | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.cluster = dict(self.cluster)

    def running_time(self, now: float) -> float:
        """Seconds the JobSet has run (not suspended) up to `now`."""
        return self.running_s + (0.0 if self.running_since is None else now - self.running_since)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        where = f"JobSet {self.namespace}/{self.name}"
        errors = 0
        failing_since: float | None = None  # this trigger's own, for its budget
        last_line = None
        while True:
            try:
                jobset = await self.read_jobset()
            except JobSetGone as exc:
                yield TriggerEvent(self._event("Failed", reason="NotFound", message=str(exc)))
                return
            except Exception as exc:
                now = _now()
                errors += 1
                failing_since = now if failing_since is None else failing_since
                self._hook = None  # the next read looks the endpoint up again
                down_s = now - failing_since
                if self.outage_since is None:
                    self.outage_since = failing_since
                self.log.warning(
                    "%s: read %d failed (API failing for %.0fs; the watch goes on): %r",
                    where, errors, now - self.outage_since, exc,
                )  # fmt: skip
                if down_s >= self.api_error_budget_s:
                    message = (
                        f"the Kubernetes API has failed every read for "
                        f"{now - self.outage_since:.0f}s (last: {exc!r}); the JobSet is left "
                        "as it is and the watch goes on"
                    )
                    yield TriggerEvent(
                        self._event(WATCHING, reason="ApiUnreachable", message=message)
                    )
                    return
                backoff = min(self.api_backoff_max_s, self.poll_interval_s * 2 ** (errors - 1))
                # The last wait ends at the budget, so re-deferring is neither early nor late.
                await _sleep(min(backoff, self.api_error_budget_s - down_s))
                continue
            now = _now()
            if self.outage_since is not None:
                self.log.info(
                    "%s: the API answers again after %.0fs", where, now - self.outage_since
                )
            errors, failing_since, self.outage_since = 0, None, None
            uid = (jobset.get("metadata") or {}).get("uid")
            if self.uid is not None and uid != self.uid:
                message = (
                    f"{where} is another object now (uid {uid!r}, created as {self.uid!r}): it "
                    "was deleted and created again by someone else; rcpflow leaves it alone"
                )
                yield TriggerEvent(self._event("error", reason=REPLACED, message=message))
                return
            changed = self.uid is None and uid is not None
            self.uid = uid
            try:
                status = interpret_status(jobset)
            except JobSetStatusError as exc:
                yield TriggerEvent(self._event("error", message=f"unreadable status: {exc}"))
                return
            line = status.describe()
            if line != last_line:
                self.log.info("%s: %s", where, line)
                last_line = line
            if status.terminal:
                pods = await self._failed_pod_lines() if status.phase == "Failed" else []
                yield TriggerEvent(
                    self._event(
                        status.phase,
                        reason=status.reason,
                        message=status.message,
                        progress=status.progress,
                        pods=pods,
                    )
                )
                return
            over_bound: str | None = None  # the reason of a time bound passed; `message` says it
            if status.suspended:
                if self.running_since is not None:
                    self.running_s, self.running_since = self.running_time(now), None
                    changed = True
                if self.suspended_since is None:
                    self.suspended_since, changed = now, True
                suspended_s = now - self.suspended_since
                if self.max_suspended_s is not None and suspended_s >= self.max_suspended_s:
                    over_bound = SUSPENDED_TOO_LONG
                    message = (
                        f"suspended (not admitted) for {suspended_s:.0f}s, the bound is "
                        f"{self.max_suspended_s:.0f}s: {status.message}"
                    )
            else:
                if self.suspended_since is not None:
                    self.suspended_since, changed = None, True
                if self.running_since is None:
                    self.running_since, changed = now, True
                running_s = self.running_time(now)
                if self.max_running_s is not None and running_s >= self.max_running_s:
                    over_bound = RUNNING_TOO_LONG
                    message = (
                        f"still running after {running_s:.0f}s (not counting time suspended), "
                        f"the bound is {self.max_running_s:.0f}s"
                    )
            if over_bound is not None:
                yield TriggerEvent(
                    self._event(
                        "Failed", reason=over_bound, message=message, progress=status.progress
                    )
                )
                return
            seen, stop = await self.stop_request(where, _now)
            changed = changed or seen
            if stop is not None:
                await (await self.hook()).delete_jobset(self.namespace, self.name)
                self.log.warning("%s: %s: deleted", where, stop)
                yield TriggerEvent(
                    self._event("Stopped", reason="StopRequest", message=stop, progress=line)
                )
                return
            if changed:  # persisted by the operator's next defer
                yield TriggerEvent(self._event(WATCHING, reason="StateChanged", progress=line))
                return
            await _sleep(self.poll_interval_s)

    def _event(
        self,
        phase: str,
        *,
        reason: str = "",
        message: str = "",
        progress: str = "",
        pods: Sequence[str] = (),
    ) -> dict[str, Any]:
        return {
            "phase": phase,
            "name": self.name,
            "namespace": self.namespace,
            "reason": reason,
            "message": message,
            "progress": progress,
            "pods": list(pods),
            "kwargs": self.kwargs() if phase == WATCHING else None,
        }

    async def _failed_pod_lines(self) -> list[str]:
        # The reason and exit code of the failed pods make the task's error actionable; not
        # being able to read them must not hide the failure itself.
        try:
            hook = await self.hook()
            return failed_pods(await hook.list_jobset_pods(self.namespace, self.name))
        except Exception as exc:
            return [f"(could not read the JobSet's pods: {exc!r})"]

    async def read_jobset(self) -> dict[str, Any]:
        """The JobSet object from the cluster; JobSetGone when it does not exist."""
        return await (await self.hook()).get_jobset(self.namespace, self.name)

    async def hook(self) -> AsyncJobSetHook:
        """The hook of the cluster, its endpoint looked up on first use and after an error."""
        if self._hook is None:
            from tasks.backends.gke.hooks import AsyncJobSetHook

            self._hook = await AsyncJobSetHook.for_cluster(cluster_from_kwargs(self.cluster))
        return self._hook
