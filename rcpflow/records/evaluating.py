"""``eval/step_<n>/evaluating.json``: an evaluation of that checkpoint is running, so retention
keeps the checkpoint (`rcpflow.retention.rule`).

rcpflow's evaluator (`tpu_jobs.eval.cli.run_step`) holds it around its evaluation (`held`):
written before the checkpoint is read, removed once the summary is persisted, or the evaluation
failed, or SIGTERM stopped it (a cancelled evaluation, as every backend cancels one, leaves
none). A process killed outright (SIGKILL, a lost node) leaves it behind: retention then keeps
the checkpoint and names the record, which a person removes once no evaluation of the step runs.
With several workers each worker's first process writes it and worker 0 alone removes it (it
writes the summary, after the others' shards arrived).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from types import FrameType

from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import read_if_present, storage_for


def running(run_dir: str, step: int) -> str | None:
    """Who evaluates `step`'s checkpoint now and since when, as its record says; None when
    no record is there. A record that cannot be read still counts: it says one may run."""
    path = RunLayout(run_dir).evaluating(step)
    data = read_if_present(path)
    if data is None:
        return None
    try:
        held = json.loads(data)
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(held["since_ms"] / 1000))
        return f"{path}: pid {held['pid']} on {held['host']} since {since}"
    except (ValueError, TypeError, KeyError, OverflowError):
        return f"{path} (unreadable)"


@contextlib.contextmanager
def held(run_dir: str, step: int, checkpoint_path: str, *, remove: bool) -> Iterator[None]:
    """Write `step`'s record for the block; with `remove` (the worker that persists the
    summary), remove it at the block's end and on SIGTERM (then the signal does what it did)."""
    path = RunLayout(run_dir).evaluating(step)
    store = storage_for(path)
    record = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since_ms": time.time_ns() // 10**6,
        "checkpoint_path": checkpoint_path,
    }
    store.write_atomic(path, (json.dumps(record) + "\n").encode())
    earlier = signal.getsignal(signal.SIGTERM)
    restore = earlier if earlier is not None else signal.SIG_DFL  # None: set outside Python
    # Ignored SIGTERM stays ignored: the evaluation would go on with its record gone.
    watching = (
        remove
        and threading.current_thread() is threading.main_thread()
        and earlier != signal.SIG_IGN
    )
    if watching:

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            store.delete(path)
            signal.signal(signal.SIGTERM, restore)
            if restore == signal.SIG_DFL and os.getpid() == 1:
                # a container's PID 1: the kernel ignores a signal's default action there, so
                # end as the default would have (128 + SIGTERM), not go on without the record
                raise SystemExit(128 + signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # now the earlier handler, or the default death

        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        if watching:
            signal.signal(signal.SIGTERM, restore)
        if remove:
            store.delete(path)
