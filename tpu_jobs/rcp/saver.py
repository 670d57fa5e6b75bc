"""The ordered background save queue behind checkpointing, independent of how a save is written.

Saves run on one worker thread, one at a time, in increasing step order, each followed by its
``on_commit``. The caller waits only while `max_pending` saves are queued or writing (that bounds
the snapshots held in memory). The first failure stops the queue, since a later save would leave
a gap in the manifest, and every later call raises `SaveFailedError` naming the failed step.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class SaveQueueError(RuntimeError):
    """A save the queue refuses (out of step order, after close); the message names the step."""


class SaveFailedError(SaveQueueError):
    """A queued save failed in the background; the queue accepts no more saves."""


class Committed(Protocol):
    """What a write returns once its step is committed on storage."""

    @property
    def step(self) -> int: ...

    @property
    def path(self) -> str: ...


JobT = TypeVar("JobT")
CommittedT = TypeVar("CommittedT", bound=Committed)


class OrderedSaveQueue(Generic[JobT, CommittedT]):
    """Jobs written by ``write(job)`` on one worker thread, in the order `put` queued them.

    ``on_commit(committed)`` runs in that thread right after each write, before the next starts.
    """

    def __init__(
        self,
        write: Callable[[JobT], CommittedT],
        *,
        max_pending: int,
        on_commit: Callable[[CommittedT], None] | None = None,
        thread_name: str = "save-queue",
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self.max_pending = max_pending
        self._write = write
        self._on_commit = on_commit
        self._thread_name = thread_name
        self._cond = threading.Condition()
        # Guarded by _cond: steps queued or writing (the head is the one writing), committed
        # saves not yet returned by `wait`, the first failure, the worker if one runs.
        self._queue: deque[tuple[int, JobT]] = deque()
        self._committed: list[CommittedT] = []
        self._failure: tuple[str, BaseException] | None = None
        self._worker: threading.Thread | None = None
        self._last_step: int | None = None
        self._closed = False
        self.waited_s = 0.0  # put()'s time waiting for room, in all

    def check(self, step: int) -> None:
        """Raise now what `put(step, ...)` would refuse, without waiting for room."""
        with self._cond:
            self._check(step)

    def put(self, step: int, prepare: Callable[[], JobT]) -> None:
        """Queue the job ``prepare()`` builds for `step`; blocks while `max_pending` saves are
        unfinished. `prepare` runs in the caller's thread once there is room, outside the lock;
        what it raises propagates and nothing is queued. Steps must increase from call to call.
        Raises `SaveFailedError` if an earlier save failed."""
        with self._cond:
            self._check(step)
            started = time.perf_counter()
            while len(self._queue) >= self.max_pending and self._failure is None:
                self._cond.wait()
            self.waited_s += time.perf_counter() - started
            self._raise_if_failed()
        job = prepare()
        with self._cond:
            self._raise_if_failed()
            self._queue.append((step, job))
            self._last_step = step
            if self._worker is None:
                # A daemon: writers such as Orbax cannot write once interpreter shutdown has
                # begun, so a process that exits without wait() drops the queued saves as a
                # crash would (no commit, no on_commit). It exits whenever the queue is empty.
                self._worker = threading.Thread(
                    target=self._work, name=self._thread_name, daemon=True
                )
                self._worker.start()

    def pending(self) -> list[int]:
        """Steps queued or being written, ascending."""
        with self._cond:
            return [step for step, _ in self._queue]

    def wait(self) -> list[CommittedT]:
        """Block until every queued save has committed; return the committed saves not yet
        returned, ascending. Raises `SaveFailedError` if one failed."""
        with self._cond:
            self._drain()
            self._raise_if_failed()
            done, self._committed = self._committed, []
            return done

    def close(self) -> None:
        """Accept no more saves, let the queued ones finish (committed ones stay returned by
        `wait`); raises `SaveFailedError` if one failed. Idempotent."""
        with self._cond:
            self._closed = True
            self._drain()
            self._raise_if_failed()

    def _check(self, step: int) -> None:
        self._raise_if_failed()
        if self._closed:
            raise SaveQueueError(f"step {step}: save() after close()")
        if self._last_step is not None and step <= self._last_step:
            raise SaveQueueError(
                f"step {step}: saves must be in increasing step order (last was {self._last_step})"
            )

    def _drain(self) -> None:
        while self._queue and self._failure is None:
            self._cond.wait()

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            message, cause = self._failure
            raise SaveFailedError(message) from cause

    def _work(self) -> None:
        while True:
            with self._cond:
                if not self._queue or self._failure is not None:
                    self._worker = None
                    self._cond.notify_all()
                    return
                step, job = self._queue[0]  # stays pending (counted by max_pending) until done
            committed: CommittedT | None = None
            try:
                committed = self._write(job)
                if self._on_commit is not None:
                    self._on_commit(committed)
            except BaseException as e:
                self._fail(step, committed, e)
                return
            with self._cond:
                self._queue.popleft()
                self._committed.append(committed)
                self._cond.notify_all()

    def _fail(self, step: int, committed: CommittedT | None, error: BaseException) -> None:
        with self._cond:
            dropped = [s for s, _ in self._queue if s != step]
            what = (
                "could not be saved"
                if committed is None
                else f"was committed at {committed.path} but on_commit failed"
            )
            self._failure = (
                f"step {step}: checkpoint {what}: {error!r}"
                + (f"; steps {dropped} were queued after it and not saved" if dropped else "")
                + "; the saver accepts no more saves",
                error,
            )
            self._queue.clear()
            self._worker = None
            self._cond.notify_all()
