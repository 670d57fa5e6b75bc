"""Which failures of a training job are the user's, and the exit code each gets.

The codes are the job contract of `rcpflow.trainer.job_exit` (docs/exit-codes.md): arguments that
are not those of the run in the folder exit 2, a run folder or checkpoint that cannot be used as it
is exits 5, a failed save or a storage error that may be transient exits 1 (one line, and a
restart may cure it). Each is one line on stderr; anything else is a bug and keeps its
traceback (exit 1).
"""

from __future__ import annotations

from rcpflow.files.storage import StorageError
from rcpflow.records.manifest import ManifestError
from rcpflow.records.mllog import MLLogError
from rcpflow.trainer import job_exit
from rcpflow.trainer.recorder import RecorderError
from tpu_jobs.rcp.checkpoint_format import CheckpointError
from tpu_jobs.rcp.distributed import LayoutError
from tpu_jobs.rcp.fingerprint import FingerprintMismatchError
from tpu_jobs.rcp.hooks import RunMismatchError
from tpu_jobs.rcp.saver import SaveFailedError
from tpu_jobs.rcp.sharding import BatchSplitError

BAD_ARGUMENTS = job_exit.EXIT_BAD_ARGUMENTS
INVALID_INPUT = job_exit.EXIT_INVALID_INPUT
ARGUMENT_ERRORS: tuple[type[Exception], ...] = (RunMismatchError, LayoutError, BatchSplitError)
INVALID_INPUT_ERRORS: tuple[type[Exception], ...] = (
    CheckpointError,
    ManifestError,
    MLLogError,
    FingerprintMismatchError,
    RecorderError,
)
# Told in one line; `report` gives each its code.
USER_ERRORS: tuple[type[Exception], ...] = (
    ARGUMENT_ERRORS + INVALID_INPUT_ERRORS + (SaveFailedError, StorageError, OSError)
)


def report(prog: str, e: Exception) -> int:
    """Tell `e` (one of `USER_ERRORS`) as `prog`'s one error line; its exit code."""
    return job_exit.report(prog, e, ARGUMENT_ERRORS, INVALID_INPUT_ERRORS)
