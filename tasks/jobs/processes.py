"""Stopping the processes we started, by the PID we hold, and a free loopback port.

`stop_processes` signals each process (SIGINT for a clean shutdown, SIGTERM for a job), waits
up to a grace period for all of them, then SIGKILLs what is left: with ``group=True`` the whole
process group of each (they were started as session leaders), with ``descendants`` every
descendant found before the first signal (children that start their own sessions, and would
be re-parented, and so unfindable, once their parent dies).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from typing import Any, Self

KILL_WAIT_S = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(roots: Iterable[int]) -> set[int]:
    """PIDs of all living descendants of `roots` (from /proc: pid -> parent pid)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue  # exited meanwhile
        # "pid (comm) state ppid ...": comm may contain spaces and parentheses
        parents[int(entry)] = int(stat[stat.rfind(")") + 2 :].split()[1])
    found: set[int] = set()
    frontier = set(roots)
    while frontier:
        children = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= children
        frontier = children
    return found


def send_signal(pid: int, sig: signal.Signals, *, group: bool = False) -> None:
    """`sig` to `pid` (to its process group when `group`); one already gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def stop_processes(
    processes: Sequence[subprocess.Popen[Any]],
    *,
    first: signal.Signals,
    grace_s: float,
    group: bool = False,
    with_descendants: bool = False,
) -> None:
    """Signal `first` to every living one of `processes`, wait up to `grace_s` in all, then
    SIGKILL what is left (see the module doc for `group` and `with_descendants`) and reap."""
    living = [p for p in processes if p.poll() is None]
    found = descendants(p.pid for p in living) if with_descendants else set()
    for proc in living:
        send_signal(proc.pid, first)
    deadline = time.monotonic() + grace_s
    for proc in living:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    for proc in processes:
        # a group outlives its leader: the executor's workers and their task processes
        if group or proc.poll() is None:
            send_signal(proc.pid, signal.SIGKILL, group=group)
    for pid in sorted(found):
        send_signal(pid, signal.SIGKILL)
    for proc in processes:
        if proc.poll() is None:
            proc.wait(timeout=KILL_WAIT_S)


class Server:
    """A context manager around `start` and `stop`: ``with Server(...) as s:``; a start that
    fails half-way is stopped before the error goes on."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
