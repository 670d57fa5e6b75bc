"""Which failures of a training job are the user's, and the exit code each class gets.

Arguments that are not those of the run in the run folder exit 2 (like argparse's errors), a
run folder that cannot be resumed as it is exits 1; each is one line on stderr,
``<prog>: error: <what>``. Anything else is a bug and keeps its traceback. The contract:
docs/tpu_jobs.md (exit codes).
"""

from __future__ import annotations

import sys

from rcpflow.manifest import ManifestError
from rcpflow.mllog import MLLogError
from rcpflow.storage import StorageError
from rcpflow.usererrors import describe
from tpu_jobs.rcp.checkpoint_format import CheckpointError
from tpu_jobs.rcp.distributed import LayoutError
from tpu_jobs.rcp.fingerprint import FingerprintMismatchError
from tpu_jobs.rcp.hooks import RunMismatchError
from tpu_jobs.rcp.saver import SaveFailedError
from tpu_jobs.rcp.sharding import BatchSplitError

BAD_ARGUMENTS = 2
BAD_RUN_STATE = 1
ARGUMENT_ERRORS: tuple[type[Exception], ...] = (RunMismatchError, LayoutError, BatchSplitError)
# A run folder left in a bad state: one line, exit 1.
RUN_STATE_ERRORS: tuple[type[Exception], ...] = (
    CheckpointError,
    ManifestError,
    MLLogError,
    FingerprintMismatchError,
    SaveFailedError,
    StorageError,
    OSError,
)
USER_ERRORS: tuple[type[Exception], ...] = ARGUMENT_ERRORS + RUN_STATE_ERRORS


def report(prog: str, e: Exception) -> int:
    """Tell `e` (one of `USER_ERRORS`) as `prog`'s one error line; its exit code."""
    print(f"{prog}: error: {describe(e)}", file=sys.stderr)
    return BAD_ARGUMENTS if isinstance(e, ARGUMENT_ERRORS) else BAD_RUN_STATE
