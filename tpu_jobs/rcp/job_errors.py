"""Which failures of a training job are the user's, and the exit code each class gets.

Shared by ``python -m tpu_jobs.train`` and ``python -m tpu_jobs.tunix_train`` so that the same
problem ends both the same way: arguments that are not those of the run in the run folder (its
checkpoints record another seed, gbs, val_start_at or max_steps; an inconsistent process layout)
exit 2, like argparse's own errors, the message naming the flag; a run folder that cannot be
resumed as it is (a lost or cut MLLOG, a deleted checkpoint, a garbage manifest line, a path
that is a file, a folder that cannot be written) exits 1. Each is one line on stderr,
``<prog>: error: <what>``, never a traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys

from rcpflow.manifest import ManifestError
from rcpflow.mllog import MLLogError
from rcpflow.storage import StorageError
from rcpflow.usererrors import describe
from tpu_jobs.checkpoint import CheckpointError
from tpu_jobs.distributed import LayoutError
from tpu_jobs.fingerprint import FingerprintMismatchError
from tpu_jobs.rcp_hooks import RunMismatchError
from tpu_jobs.saver import SaveFailedError

BAD_ARGUMENTS = 2
BAD_RUN_STATE = 1
ARGUMENT_ERRORS: tuple[type[Exception], ...] = (RunMismatchError, LayoutError)
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
