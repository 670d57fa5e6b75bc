"""The exit codes of every job rcpflow runs, and which failure gets which (docs/exit-codes.md).

A deterministic user error fails at once (2 bad arguments, 5 invalid input); anything that a
rerun may cure is 1 and restarts; 143 is SIGTERM. Jobs in any language may use the codes; Python
jobs classify their exceptions with `exit_code_of` and tell them with `report`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Literal

from rcpflow.files.usererrors import describe
from rcpflow.records.manifest import ManifestError
from rcpflow.records.mllog import MLLogError
from rcpflow.trainer.ownership import LeaseTimeoutError
from rcpflow.trainer.recorder import RunFolderError

EXIT_OK = 0
EXIT_RESTART = 1  # Python's own code for an uncaught exception: restart, counted
EXIT_BAD_ARGUMENTS = 2
EXIT_FATAL = 3  # evaluation: the summary records a fatal error
EXIT_INCOMPLETE = 4  # evaluation: shards missing at the timeout
EXIT_INVALID_INPUT = 5
EXIT_SIGTERM = 143

# What a cluster backend does when a job ends with a code (docs/exit-codes.md, the job
# contract's last column): every cluster backend renders its retry policy from `restart_decision`.
RestartDecision = Literal["fail_now", "restart_counted", "restart_uncounted"]
# The deterministic user errors: rerunning the same command on the same input cannot help.
DEFAULT_FAIL_EXIT_CODES: tuple[int, ...] = (EXIT_BAD_ARGUMENTS, EXIT_INVALID_INPUT)
# Not the job's fault (preemption, eviction, maintenance): a restart that costs no budget.
UNCOUNTED_EXIT_CODES: tuple[int, ...] = (EXIT_SIGTERM,)

# Failures that the same command on the same files repeats: the folder or input is not usable as
# it is. A storage error that may be transient is not among them (it is EXIT_RESTART).
INVALID_INPUT_ERRORS: tuple[type[Exception], ...] = (
    ManifestError,
    MLLogError,
    RunFolderError,
    LeaseTimeoutError,  # a setting of the job's environment: the same on every restart
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
    FileNotFoundError,
)


def exit_code_of(
    e: BaseException,
    argument_errors: tuple[type[Exception], ...] = (),
    invalid_input_errors: tuple[type[Exception], ...] = (),
) -> int:
    """The contract's code for `e`: 2 for `argument_errors`, 5 for invalid input, else 1."""
    if isinstance(e, argument_errors):
        return EXIT_BAD_ARGUMENTS
    if isinstance(e, INVALID_INPUT_ERRORS + invalid_input_errors):
        return EXIT_INVALID_INPUT
    return EXIT_RESTART


def report(
    prog: str,
    e: Exception,
    argument_errors: tuple[type[Exception], ...] = (),
    invalid_input_errors: tuple[type[Exception], ...] = (),
) -> int:
    """Tell `e` as `prog`'s one error line (``<prog>: error: <what>``); its exit code."""
    print(f"{prog}: error: {describe(e)}", file=sys.stderr)
    return exit_code_of(e, argument_errors, invalid_input_errors)


def restart_decision(
    exit_code: int,
    *,
    disrupted: bool = False,
    fail_exit_codes: Iterable[int] = DEFAULT_FAIL_EXIT_CODES,
) -> RestartDecision:
    """What a cluster does with a job that ended with `exit_code` (not 0): a disruption (the
    pod or node was taken away, whatever its code) or SIGTERM restarts without counting; a code
    of `fail_exit_codes` fails at once; anything else (1, a signal, any other code) restarts,
    counted against the job's restart budget."""
    if disrupted or exit_code in UNCOUNTED_EXIT_CODES:
        return "restart_uncounted"
    if exit_code in tuple(fail_exit_codes):
        return "fail_now"
    return "restart_counted"


def fail_exit_codes_problem(codes: Iterable[int]) -> str | None:
    """Why `codes` cannot be a deployment's fail-at-once codes, or None when they can."""
    codes = tuple(codes)
    bad = [c for c in codes if not 1 <= c <= 255]
    if bad:
        return f"exit codes are 1..255 (0 is success), got {bad}"
    if EXIT_RESTART in codes:
        return (
            "1 is Python's exit code for any uncaught exception (an XLA runtime error, a "
            "transient storage error): those restart, counted (docs/exit-codes.md); a job "
            "reports a deterministic user error with 2 or 5"
        )
    if EXIT_SIGTERM in codes:
        return "143 is SIGTERM (preemption): it restarts without counting"
    return None
