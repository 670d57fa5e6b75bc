"""What a finished Slurm job means under the job exit-code contract (docs/exit-codes.md): done,
fail at once, restart counted against `max_restarts`, restart not counted, or cancelled."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from rcpflow.trainer.job_exit import EXIT_SIGTERM
from tasks.backends.slurm.hooks import JobInfo

Decision = Literal["succeeded", "fail", "restart", "restart_uncounted", "cancelled"]
# Not the job's fault: the node or the scheduler took it away.
_DISRUPTIONS = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})
# How close to its time limit a job that ended on SIGTERM must have run for that SIGTERM to be
# the limit's own warning (--signal=B:TERM@grace: sent up to 60 s early, limits checked ~30 s).
_LIMIT_SLACK_S = 90


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    why: str


def decide(
    info: JobInfo, fail_exit_codes: Collection[int], signal_grace_s: int, time_limit_s: int
) -> Outcome:
    """The contract's answer for the finished job `info`."""
    state, code = info.state, info.exit_code
    said = f"{state}, exit code {code}" + (f" (signal {info.signal})" if info.signal else "")
    if state == "COMPLETED" and code == 0:
        return Outcome("succeeded", said)
    if state == "CANCELLED":
        return Outcome("cancelled", f"{said}: cancelled (scancel)")
    if state in _DISRUPTIONS:
        return Outcome("restart_uncounted", f"{said}: not the job's fault, restarted uncounted")
    if state == "TIMEOUT":
        return Outcome("restart", f"{said}: its time limit ({time_limit_s} s) passed")
    if code is not None and code in fail_exit_codes:
        return Outcome("fail", f"{said}: a user error that a rerun repeats (docs/exit-codes.md)")
    if code == EXIT_SIGTERM:
        ran = info.run_time_s
        if ran is not None and ran >= time_limit_s - signal_grace_s - _LIMIT_SLACK_S:
            return Outcome(
                "restart",
                f"{said}: stopped by the time limit's SIGTERM ({signal_grace_s} s before its "
                f"{time_limit_s} s) after {ran} s, its saves drained",
            )
        return Outcome("restart_uncounted", f"{said}: SIGTERM (preemption), restarted uncounted")
    return Outcome("restart", f"{said}: restarted, counted")
