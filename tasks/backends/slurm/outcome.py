"""What a finished Slurm job means under the job exit-code contract (docs/exit-codes.md): done,
cancelled, or `rcpflow.trainer.job_exit.restart_decision`'s answer (fail now, restart counted
against `max_restarts`, restart uncounted). The exit code's part is that function's, as on every
cluster backend; Slurm's own end states (TIMEOUT, PREEMPTED, NODE_FAIL, BOOT_FAIL, CANCELLED)
and its time limit's SIGTERM are mapped here onto the same vocabulary."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from rcpflow.trainer.job_exit import RestartDecision, restart_decision
from tasks.backends.slurm.hooks import JobInfo

Decision = Literal["succeeded", "cancelled"] | RestartDecision
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
        return Outcome("restart_counted", f"{said}: its time limit ({time_limit_s} s) passed")
    if code is None:
        # Slurm's answer held no code rcpflow could read (a shape it does not know): a
        # restart would hide that and might repeat a job that succeeded; fail, saying so.
        return Outcome(
            "fail_now",
            f"{state}: Slurm's answer ({info.source}) held no exit code rcpflow can read; "
            "not restarted (docs/exit-codes.md, Slurm's shapes)",
        )
    by_code = restart_decision(code, fail_exit_codes=tuple(fail_exit_codes))
    if by_code == "fail_now":
        return Outcome(
            "fail_now", f"{said}: a user error that a rerun repeats (docs/exit-codes.md)"
        )
    if by_code == "restart_uncounted":
        # SIGTERM: preemption, unless it is the time limit's own warning (then it counts).
        ran = info.run_time_s
        if ran is not None and ran >= time_limit_s - signal_grace_s - _LIMIT_SLACK_S:
            return Outcome(
                "restart_counted",
                f"{said}: stopped by the time limit's SIGTERM ({signal_grace_s} s before its "
                f"{time_limit_s} s) after {ran} s, its saves drained",
            )
        return Outcome("restart_uncounted", f"{said}: SIGTERM (preemption), restarted uncounted")
    return Outcome("restart_counted", f"{said}: restarted, counted")
