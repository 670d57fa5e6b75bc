"""Read a JobSet's status: Running, Succeeded, or Failed with the controller's reason.

The JobSet controller (jobset.x-k8s.io/v1alpha2) reports:
- ``status.conditions``: ``Completed`` / ``Failed`` (terminal) and ``Suspended`` (queued, e.g.
  by Kueue), each ``{"type", "status": "True"|"False", "reason", "message", ...}``;
- ``status.terminalState``: ``Completed`` or ``Failed`` once it has finished;
- ``status.replicatedJobsStatus``: per replicated job, how many child Jobs are ready, active,
  succeeded, failed, suspended; ``status.restarts``: global restarts so far.

A contradictory or malformed status raises JobSetStatusError (naming the field) rather than
being guessed at. Pure standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Phase = Literal["Running", "Succeeded", "Failed"]

_TERMINAL_STATES = ("Completed", "Failed")
_COUNTS = ("ready", "active", "succeeded", "failed", "suspended")


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
