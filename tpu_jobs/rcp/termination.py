"""What a job does on SIGTERM (Kubernetes' notice before SIGKILL: a preemption, an eviction,
a JobSet restart or deletion): stop training where it is, as if it had crashed, but let the
checkpoint saves already queued finish with their manifest rows, so a resume loses nothing that
was computed. The pod's terminationGracePeriodSeconds (tasks.backends.gke settings) is the
time this has.

Python's default for SIGTERM kills the process at once, skipping every ``finally`` and
``__exit__``; `exit_on_sigterm` turns the signal into `Terminated` (a SystemExit with the
shell's code for it, 143) raised in the main thread, which unwinds through the trainer's
``with hooks:`` (that drains the save queue and writes no block_stop).
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
