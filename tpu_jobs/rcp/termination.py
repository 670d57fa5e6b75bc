"""SIGTERM (Kubernetes' notice before SIGKILL) stops a job as if it had crashed, but only after
the checkpoint saves already queued have finished with their rows: `exit_on_sigterm` turns it
into `Terminated` (exit 143) raised in the main thread (docs/tpu_jobs.md).
"""

from __future__ import annotations

import signal
from types import FrameType

SIGTERM_EXIT_CODE = 128 + signal.SIGTERM


class Terminated(SystemExit):
    """SIGTERM arrived; the process exits with `SIGTERM_EXIT_CODE` once it has unwound."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    # Once: a second SIGTERM while unwinding must not cut the save queue's drain short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated(SIGTERM_EXIT_CODE)


def exit_on_sigterm() -> None:
    """From now on SIGTERM raises `Terminated` in the main thread. Call from the main thread."""
    signal.signal(signal.SIGTERM, _raise_terminated)
