"""`JobState`: a job as one read saw it, in the lifecycle's terms, whatever the driver: running,
or ended with one `Outcome`. A driver maps its own read into it (`protocol.JobDriver.read`);
the watch trigger carries it in its event (`as_json`/`from_json`), and the run operator decides
from its outcome alone (`tasks.backend_api.job_operator`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

# How a job ended:
# - succeeded;
# - failed: a retry of the task may run it again (the task fails with its retries);
# - fail_now: a rerun would fail the same way (the task fails without retries);
# - restart, restart_uncounted: the driver starts it again, counted against its
#   `max_restarts` or not (`rcpflow.trainer.job_exit.restart_decision`'s answers);
# - cancelled: someone else cancelled it;
# - lost: the watch cannot follow it (forgotten by the cluster, an unreadable status): it is
#   left as it is, and a retry of the task adopts it;
# - foreign: its name holds another object now: never the task's to follow nor to cancel.
Outcome = Literal[
    "succeeded", "failed", "fail_now", "restart", "restart_uncounted", "cancelled", "lost",
    "foreign",
]  # fmt: skip
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)


@dataclass(frozen=True)
class JobState:
    """`outcome`: None while the job runs; `line`: how the task log states it; `exit_code`: how
    it exited, where the driver tells; `reason`: the driver's word for the outcome (a
    JobSet's condition, a bound of the deployment); `detail`: lines a failure's error adds
    (failed pods); `output`: the job's new output lines since the last read (the task log
    shows them); `changed`: the watch's memo changed in a way that a triggerer restart must
    not lose (the trigger re-defers to persist it)."""

    line: str
    outcome: Outcome | None = None
    exit_code: int | None = None
    reason: str = ""
    detail: tuple[str, ...] = ()
    output: tuple[str, ...] = ()
    changed: bool = False

    @property
    def ended(self) -> bool:
        """The job will not run again by itself."""
        return self.outcome is not None

    def as_json(self) -> dict[str, Any]:
        """As an event carries it (no output: the task log had it)."""
        out = asdict(self)
        out["detail"] = list(self.detail)
        del out["output"], out["changed"]
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> JobState:
        outcome = value.get("outcome")
        if outcome is not None and outcome not in OUTCOMES:
            raise ValueError(f"not a job outcome: {outcome!r}")
        code = value.get("exit_code")
        return cls(
            line=str(value["line"]),
            outcome=outcome,
            exit_code=None if code is None else int(code),
            reason=str(value.get("reason") or ""),
            detail=tuple(str(d) for d in value.get("detail") or ()),
        )
