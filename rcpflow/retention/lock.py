"""One retention apply per run folder at a time: an exclusive lock held for the whole apply.

`rcpflow retention apply` and the run DAG's retention tasks both take it (`apply_run` does), so
two applies never interleave their plans, deletes and record writes. A second apply gets
`RetentionBusy`, one line naming the lock and its holder, at once or, with a patience (the run
DAG's evaluate tasks, whose applies follow one another), once the lock stayed held that long.

- Local disk and a Slurm cluster's shared folder: ``flock`` on ``<run_dir>/.retention.lock``
  (`RunLayout.retention_lock`), taken without blocking. The kernel drops it when its holder
  exits, however it exits, so a killed apply leaves no stale lock. (Linux's NFS client turns
  ``flock`` into an NFS byte-range lock, which holds across the cluster's nodes; Lustre needs
  its ``flock`` mount option.) The file stays; only its lock matters.
- ``gs://``: the object ``<run_dir>/.retention.lock`` created only if absent
  (``ifGenerationMatch=0``) with who holds it, deleted at that generation when the apply ends.
  GCS cannot tell whether a holder still lives, so one killed mid-apply leaves the object: the
  next apply names it, its holder and since when, and a person deletes it once no apply runs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator

from rcpflow.files.layout import RunLayout, is_gcs
from rcpflow.files.storage import GCSStorage, storage_for


class RetentionBusy(RuntimeError):
    """Another apply holds the run folder (or its lock cannot be taken: a link, no write
    permission); the message names the lock (and its holder)."""


def _holder() -> dict[str, object]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "since_ms": time.time_ns() // 10**6}


def _busy(path: str, holder: str) -> RetentionBusy:
    return RetentionBusy(
        f"{path}: another retention apply holds the run folder ({holder}); rerun once it is done"
    )


@contextlib.contextmanager
def _local(path: str) -> Iterator[None]:
    try:  # never through a link: the lock is the run folder's own file
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        raise RetentionBusy(f"{path}: cannot take the retention lock: {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            held = os.pread(fd, 1000, 0).decode(errors="replace").strip()
            raise _busy(path, held or "holder unknown") from None
        # Who holds it, for the message a second apply prints (written under the lock).
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing drops the flock


@contextlib.contextmanager
def _gcs(path: str) -> Iterator[None]:
    store = storage_for(path)
    assert isinstance(store, GCSStorage)
    generation = store.create_if_absent(path, json.dumps(_holder()).encode())
    if generation is None:
        try:
            held = store.read_bytes(path).decode(errors="replace").strip()
        except FileNotFoundError:  # released between the two calls: it was held a moment ago
            held = "released just now"
        raise _busy(path, f"{held}; if no apply runs, delete {path}")
    try:
        yield
    finally:
        store.delete_generation(path, generation)


# How often a patient apply tries a held lock again.
RETRY_S = 0.1


@contextlib.contextmanager
def holding(run_dir: str, patience_s: float = 0.0) -> Iterator[None]:
    """Hold the run folder's retention lock for the block; RetentionBusy when another holds it
    (for longer than `patience_s`: tried again every `RETRY_S` until then)."""
    path = RunLayout(run_dir).retention_lock
    take = _gcs if is_gcs(path) else _local
    deadline = time.monotonic() + patience_s
    while True:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(take(path))
            except RetentionBusy:
                if time.monotonic() >= deadline:
                    raise
            else:
                yield
                return
        time.sleep(RETRY_S)
