"""Read a JobSet's status: Running, Succeeded, or Failed with the controller's reason.

The JobSet controller (jobset.x-k8s.io/v1alpha2) reports:
- ``status.conditions``: ``Completed`` / ``Failed`` (terminal) and ``Suspended`` (queued, e.g.
  by Kueue), each ``{"type", "status": "True"|"False", "reason", "message", ...}``;
- ``status.terminalState``: ``Completed`` or ``Failed`` once it has finished;
- ``status.replicatedJobsStatus``: per replicated job, how many child Jobs are ready, active,
  succeeded, failed, suspended; ``status.restarts``: global restarts so far.

A contradictory or malformed status raises JobSetStatusError (naming the field) rather than
being guessed at. `failed_pods` summarises the pods of a failed JobSet (core/v1 PodList): which
ones failed, why, and with which exit code, for the task's error; `over_bound` moves a watch's
clocks to a read and says which bound of the deployment it passed. Pure standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Phase = Literal["Running", "Succeeded", "Failed"]

_TERMINAL_STATES = ("Completed", "Failed")
_COUNTS = ("ready", "active", "succeeded", "failed", "suspended")


class JobSetGone(RuntimeError):
    """The JobSet asked for does not exist (never created, or deleted)."""


class JobSetStatusError(ValueError):
    """The status object does not have the JobSet API's shape, or contradicts itself."""


@dataclass(frozen=True)
class JobSetStatus:
    """What a JobSet is doing. `reason`/`message` come from its Failed (or Suspended) condition;
    `progress` summarises the child Jobs and restarts for logs."""

    phase: Phase
    reason: str = ""
    message: str = ""
    progress: str = ""
    suspended: bool = False  # waiting to be admitted (Kueue) or suspended by hand

    @property
    def terminal(self) -> bool:
        return self.phase != "Running"

    def describe(self) -> str:
        """One line for a log or a task failure."""
        text: str = self.phase
        if self.reason:
            text += f" ({self.reason})"
        if self.message:
            text += f": {self.message}"
        if self.progress:
            text += f" [{self.progress}]"
        return text


def interpret_status(jobset: Mapping[str, Any]) -> JobSetStatus:
    """The phase of a JobSet object as returned by the API (its ``status`` may be absent
    right after creation: that is Running)."""
    if not isinstance(jobset, Mapping):
        raise JobSetStatusError(f"expected a JobSet object, got {type(jobset).__name__}")
    status = jobset.get("status")
    if status is None:
        return JobSetStatus("Running", progress="no status yet")
    if not isinstance(status, Mapping):
        raise JobSetStatusError(f"status: expected an object, got {type(status).__name__}")

    true_conditions = _true_conditions(status.get("conditions", []))
    terminal_state = status.get("terminalState") or ""
    if terminal_state and terminal_state not in _TERMINAL_STATES:
        raise JobSetStatusError(
            f"status.terminalState: unknown value {terminal_state!r} "
            f"(expected one of {', '.join(_TERMINAL_STATES)})"
        )
    failed = "Failed" in true_conditions or terminal_state == "Failed"
    completed = "Completed" in true_conditions or terminal_state == "Completed"
    if failed and completed:
        raise JobSetStatusError(
            "status: contradictory, both Completed and Failed "
            f"(terminalState {terminal_state!r}, true conditions {sorted(true_conditions)})"
        )
    progress = _progress(status)
    if failed:
        condition = true_conditions.get("Failed", {})
        return JobSetStatus(
            "Failed",
            reason=condition.get("reason") or "Failed",
            message=condition.get("message") or "terminalState is Failed",
            progress=progress,
        )
    if completed:
        return JobSetStatus("Succeeded", progress=progress)
    if "Suspended" in true_conditions:
        condition = true_conditions["Suspended"]
        return JobSetStatus(
            "Running",
            reason=condition.get("reason") or "Suspended",
            message="suspended: " + (condition.get("message") or "waiting to be admitted"),
            progress=progress,
            suspended=True,
        )
    return JobSetStatus("Running", progress=progress)


def _true_conditions(conditions: Any) -> dict[str, Mapping[str, Any]]:
    if not isinstance(conditions, list):
        raise JobSetStatusError("status.conditions: expected a list")
    found: dict[str, Mapping[str, Any]] = {}
    for i, condition in enumerate(conditions):
        where = f"status.conditions[{i}]"
        if not isinstance(condition, Mapping):
            raise JobSetStatusError(f"{where}: expected an object")
        kind, state = condition.get("type"), condition.get("status")
        if not isinstance(kind, str) or state not in ("True", "False", "Unknown"):
            raise JobSetStatusError(
                f"{where}: needs a string 'type' and 'status' True/False/Unknown, "
                f"got type {kind!r} status {state!r}"
            )
        if state == "True":
            found[kind] = condition
    return found


def _progress(status: Mapping[str, Any]) -> str:
    jobs = status.get("replicatedJobsStatus", [])
    if not isinstance(jobs, list):
        raise JobSetStatusError("status.replicatedJobsStatus: expected a list")
    parts = []
    for i, job in enumerate(jobs):
        where = f"status.replicatedJobsStatus[{i}]"
        if not isinstance(job, Mapping) or not isinstance(job.get("name"), str):
            raise JobSetStatusError(f"{where}: expected an object with a name")
        counts = []
        for key in _COUNTS:
            value = job.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise JobSetStatusError(f"{where}.{key}: expected a count, got {value!r}")
            counts.append(f"{value} {key}")
        parts.append(f"{job['name']} jobs: {', '.join(counts)}")
    restarts = status.get("restarts", 0)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise JobSetStatusError(f"status.restarts: expected a count, got {restarts!r}")
    if restarts:
        parts.append(f"restarts {restarts}")
    return "; ".join(parts)


def failed_pods(pod_list: Mapping[str, Any], limit: int = 5) -> list[str]:
    """One line per failed pod of a PodList (``items``), first failures first: its name, the
    pod's reason (Evicted, DeadlineExceeded, ...), a DisruptionTarget condition's reason
    (preemption, eviction), and each terminated container's exit code and reason (OOMKilled,
    Error). At most `limit` lines, then how many more failed."""
    items = pod_list.get("items") if isinstance(pod_list, Mapping) else None
    if not isinstance(items, list):
        raise JobSetStatusError("pod list: expected an object with a list 'items'")
    failed = []
    for i, pod in enumerate(items):
        where = f"items[{i}]"
        if not isinstance(pod, Mapping):
            raise JobSetStatusError(f"{where}: expected a pod object")
        status = pod.get("status") or {}
        metadata = pod.get("metadata") or {}
        if not isinstance(status, Mapping) or not isinstance(metadata, Mapping):
            raise JobSetStatusError(f"{where}: metadata and status must be objects")
        if status.get("phase") != "Failed":
            continue
        parts = [str(metadata.get("name", "?"))]
        if status.get("reason"):
            parts.append(f"reason {status['reason']}")
        for condition in status.get("conditions") or []:
            if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
                parts.append(f"disrupted ({condition.get('reason') or 'DisruptionTarget'})")
        for container in status.get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated")
            if not isinstance(terminated, Mapping):
                continue
            text = f"container {container.get('name')} exit code {terminated.get('exitCode')}"
            if terminated.get("reason"):
                text += f" ({terminated['reason']})"
            parts.append(text)
        if status.get("message"):
            parts.append(str(status["message"]))
        finished = max(
            (
                str(((c.get("state") or {}).get("terminated") or {}).get("finishedAt") or "")
                for c in status.get("containerStatuses") or []
            ),
            default="",
        )
        head, details = parts[0], parts[1:]
        failed.append((finished, f"{head}: {', '.join(details)}" if details else head))
    failed.sort(key=lambda item: item[0])
    lines = [line for _, line in failed[:limit]]
    if len(failed) > limit:
        lines.append(f"... and {len(failed) - limit} more failed pods")
    return lines


# Reasons of a JobSet the watch gave up on (the cluster has not failed it).
SUSPENDED_TOO_LONG = "SuspendedTooLong"
RUNNING_TOO_LONG = "RunningTooLong"


def over_bound(
    memo: dict[str, Any], suspended: bool, now: float, changed: bool
) -> tuple[tuple[str, str] | None, bool]:
    """Move a watch's clocks (`memo`: running since, running time so far, suspended since, and
    the bounds `max_running_s`, `max_suspended_s`) to a read at `now` of a JobSet `suspended`
    or not: the bound passed (its reason and what it says), and whether a clock changed. Time
    suspended (waiting for admission) is bounded on its own, never counted as running."""
    running_since, running_s = memo.get("running_since"), float(memo.get("running_s", 0.0))
    if suspended:
        if running_since is not None:
            memo["running_s"], memo["running_since"] = running_s + now - running_since, None
            changed = True
        if memo.get("suspended_since") is None:
            memo["suspended_since"], changed = now, True
        suspended_s, bound = now - memo["suspended_since"], memo.get("max_suspended_s")
        if bound is not None and suspended_s >= bound:
            said = f"suspended (not admitted) for {suspended_s:.0f}s, the bound is {bound:.0f}s"
            return (SUSPENDED_TOO_LONG, said), changed
        return None, changed
    if memo.get("suspended_since") is not None:
        memo["suspended_since"], changed = None, True
    if running_since is None:
        memo["running_since"], running_since, changed = now, now, True
    ran, bound = running_s + now - running_since, memo.get("max_running_s")
    if bound is not None and ran >= bound:
        said = (
            f"still running after {ran:.0f}s (not counting time suspended), the bound is "
            f"{bound:.0f}s"
        )
        return (RUNNING_TOO_LONG, said), changed
    return None, changed
