"""The exit codes of every job rcpflow runs, and which failure gets which (docs/exit-codes.md).

A deterministic user error fails at once (2 bad arguments, 5 invalid input); anything that a
rerun may cure is 1 and restarts; 143 is SIGTERM. Jobs in any language may use the codes; Python
jobs classify their exceptions with `exit_code_of` and tell them with `report`.
"""

from __future__ import annotations

import sys

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
