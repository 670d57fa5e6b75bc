"""`JobSetTrigger`: follow a JobSet on the triggerer until it is terminal: the GKE adapter of
the shared watch loop (`tasks.backend_api.watch_trigger.WatchTrigger`: outage budget, backoff,
clock, stop request, re-deferral).

Every read and delete goes through `tasks.backends.gke.hooks.AsyncJobSetHook`, imported on the
first call, so importing this module stays cheap; the cluster's endpoint is looked up through
the Google connection when the trigger starts and again after a failed read, never kept in the
trigger's kwargs.

The trigger's clocks are wall-clock instants in its kwargs (running since, suspended since,
stop request seen, API failing since) with the JobSet's UID, and every change of them ends the
trigger with a ``watching`` event whose ``kwargs`` the operator defers again with: a triggerer
restart resumes from the last change, with every clock where it was. API trouble (apiserver
restarts, a control-plane upgrade, network loss) never fails the task: after
`outage_budget_s` of failed reads the trigger re-defers the same way (the task log says
so) and goes on. Time spent suspended (waiting for Kueue to admit the JobSet) is bounded on its
own and does not count against the job's running time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tasks.backend_api.lifecycle_names import ERROR, STOPPED, WATCHING
from tasks.backend_api.task_end import JobOutcome
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

# Reasons of a Failed event for a JobSet the watch gave up on (the cluster has not failed it).
SUSPENDED_TOO_LONG = "SuspendedTooLong"
RUNNING_TOO_LONG = "RunningTooLong"
WATCH_BOUNDS = (SUSPENDED_TOO_LONG, RUNNING_TOO_LONG)
# Reason of an error event: the JobSet of that name is another object than the one created.
REPLACED = "Replaced"
# The cluster calls, imported on a watch's first read (`JobSetTrigger.hook`).
HOOKS_MODULE = "tasks.backends.gke.hooks"


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
    ``{"phase": "Succeeded"|"Failed"|"stopped"|"error"|"watching", "name", "namespace",
    "reason", "message", "progress", "pods", "kwargs"}`` (`pods`: lines on the failed pods, for
    a Failed JobSet; `kwargs`: the state to defer again with, for watching).

    A JobSet that disappears is Failed (reason NotFound); one whose UID is not `uid` (deleted
    and created again under the same name) is ``error`` with reason Replaced. Failed reads are
    retried, the wait doubling from `poll_interval_s` up to `backoff_max_s`; after
    `outage_budget_s` of them without a good read: watching. A malformed status is
    ``error``. Suspended for `max_suspended_s` in a row: Failed (reason SuspendedTooLong);
    running (not suspended) for `max_running_s` in all: Failed (reason RunningTooLong). None:
    no bound.

    With `stop_run_dir` (training under evaluation during training), a JobSet still running
    `stop_grace_s` after a stop request of that run appeared
    (`rcpflow.verdict.stop_request.current`) is deleted: phase ``stopped``.

    State (wall-clock seconds, see the module doc): `running_s` running time before
    `running_since` (None: not running now), `suspended_since`, `stop_seen`, `outage_since`;
    `submitted_at` (when the operator created it) is kept for the operator's outer timeout.
    """

    name: str
    namespace: str
    cluster: Mapping[str, Any]
    uid: str | None = None
    poll_interval_s: float = 30.0
    outage_budget_s: float = 1200.0
    backoff_max_s: float = 120.0
    max_suspended_s: float | None = None
    max_running_s: float | None = None
    running_s: float = 0.0
    running_since: float | None = None
    suspended_since: float | None = None
    submitted_at: float | None = None
    _hook: AsyncJobSetHook | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.cluster = dict(self.cluster)

    cluster_word = "Kubernetes API"

    def running_time(self, now: float) -> float:
        """Seconds the JobSet has run (not suspended) up to `now`."""
        return self.running_s + (0.0 if self.running_since is None else now - self.running_since)

    def where(self) -> str:
        return f"JobSet {self.namespace}/{self.name}"

    async def read(self) -> dict[str, Any]:
        try:
            return await self.read_jobset()
        except JobSetGone:
            raise
        except Exception:
            self._hook = None  # the next read looks the endpoint up again
            raise

    def read_failed(self, exc: Exception) -> dict[str, Any] | None:
        if isinstance(exc, JobSetGone):
            return self._event("Failed", reason="NotFound", message=str(exc))
        return None

    async def cancel(self) -> None:
        await (await self.hook()).delete_jobset(self.namespace, self.name)

    def event(self, phase: str, *, reason: str = "", message: str = "") -> dict[str, Any]:
        return self._event(phase, reason=reason, message=message, progress=self._line)

    def job_outcome(self, payload: Any) -> JobOutcome | None:
        ref = {"name": self.name, "namespace": self.namespace}
        where = self.where()
        if payload["phase"] == "Succeeded":
            return JobOutcome(ref, "succeeded", f"{where} succeeded [{payload['progress']}]")
        if payload["phase"] == STOPPED:
            return JobOutcome(ref, "stopped", f"{where} cancelled: {payload['message']}")
        if payload["phase"] == WATCHING:
            return None
        # a Failed JobSet fails its task without retries, a watch error with them: a worker's
        line = f"{where} {payload['phase']} ({payload['reason']}): {payload['message']}"
        return JobOutcome(ref, "other", line)

    async def observe(
        self, jobset: dict[str, Any], where: str, now: float
    ) -> tuple[dict[str, Any] | None, bool]:
        uid = (jobset.get("metadata") or {}).get("uid")
        if self.uid is not None and uid != self.uid:
            message = (
                f"{where} is another object now (uid {uid!r}, created as {self.uid!r}): it "
                "was deleted and created again by someone else; rcpflow leaves it alone"
            )
            return self._event(ERROR, reason=REPLACED, message=message), False
        changed = self.uid is None and uid is not None
        self.uid = uid
        try:
            status = interpret_status(jobset)
        except JobSetStatusError as exc:
            return self._event(ERROR, message=f"unreadable status: {exc}"), False
        state = status.job_state()
        self.log_state(where, state)
        if state.ended:
            pods = await self._failed_pod_lines() if status.phase == "Failed" else []
            return self._event(
                status.phase, reason=status.reason, message=status.message,
                progress=status.progress, pods=pods,
            ), False  # fmt: skip
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
            event = self._event(
                "Failed", reason=over_bound, message=message, progress=status.progress
            )
            return event, False
        return None, changed

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
        """The hook of the cluster, its endpoint looked up on first use and after an error.
        The first use in a triggerer imports the Kubernetes client and the providers (3.3 s
        measured here): in a thread, so that no other watch of the loop waits for it."""
        if self._hook is None:
            hooks = await asyncio.to_thread(importlib.import_module, HOOKS_MODULE)
            hook_type: type[AsyncJobSetHook] = hooks.AsyncJobSetHook
            self._hook = await hook_type.for_cluster(cluster_from_kwargs(self.cluster))
        return self._hook
