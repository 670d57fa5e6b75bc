"""SIGTERM (Kubernetes' notice before SIGKILL) stops a job as if it had crashed, but only after
the checkpoint saves already queued have finished with their rows: `exit_on_sigterm` turns it
into `Terminated` (exit 143) raised in the main thread (docs/tpu_jobs.md). Inside the training
loop (`deferred`) it is only noted: the processes of a job agree after the step to stop at it
(`tpu_jobs.rcp.distributed.stop_decision`), so that all of them save the same steps.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from rcpflow.trainer.job_exit import EXIT_SIGTERM


class Terminated(SystemExit):
    """SIGTERM arrived; the process exits with `EXIT_SIGTERM` once it has unwound."""


_received: list[bool] = []  # SIGTERM arrived (`received`): set once, by the handler


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    # Once: a second SIGTERM while unwinding must not cut the save queue's drain short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _received.append(True)
    raise Terminated(EXIT_SIGTERM)


def received() -> bool:
    """Whether `exit_on_sigterm`'s SIGTERM arrived: a library the `Terminated` was raised
    through (Orbax's restore, TensorStore's reads) may have turned it into an error of its own,
    which must then end the process as the signal would, not as that error."""
    return bool(_received)


def exit_on_sigterm() -> None:
    """From now on SIGTERM raises `Terminated` in the main thread. Call from the main thread."""
    signal.signal(signal.SIGTERM, _raise_terminated)


class SigtermFlag:
    """Whether SIGTERM arrived while `deferred` held it back."""

    def __init__(self) -> None:
        self.received = False

    def __bool__(self) -> bool:
        return self.received


@contextmanager
def deferred() -> Iterator[SigtermFlag]:
    """While inside, SIGTERM only sets the flag; the caller raises `Terminated` at a step
    boundary. Afterwards SIGTERM raises again (unless one already arrived: then it is ignored,
    as after the first raise). Call from the main thread, after `exit_on_sigterm`."""
    flag = SigtermFlag()

    def note(signum: int, frame: FrameType | None) -> None:
        flag.received = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    previous = signal.signal(signal.SIGTERM, note)
    try:
        yield flag
    finally:
        if not flag.received:
            signal.signal(signal.SIGTERM, previous)
