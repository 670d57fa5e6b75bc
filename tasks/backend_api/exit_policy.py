"""The job exit-code contract (docs/exit-codes.md) as a cluster backend renders it into its
retry policy: which codes fail at once, which restart without counting; the decision itself is
`rcpflow.trainer.job_exit.restart_decision`, one home for every backend (GKE's failurePolicy,
Slurm's requeue)."""

from __future__ import annotations

from collections.abc import Iterable

from rcpflow.trainer.job_exit import RestartDecision, restart_decision

# A process exit code is 0..255; 0 is success and never reaches a retry policy.
_EXIT_CODES = range(1, 256)


def codes_deciding(decision: RestartDecision, fail_exit_codes: Iterable[int]) -> list[int]:
    """The exit codes (1..255, sorted) that `restart_decision` answers `decision` for, with the
    deployment's `fail_exit_codes`: what a backend lists in a rule of its retry policy."""
    fail = tuple(fail_exit_codes)
    return [c for c in _EXIT_CODES if restart_decision(c, fail_exit_codes=fail) == decision]
