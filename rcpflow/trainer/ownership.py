"""Run ownership: one trainer at a time in a run folder, on a local disk or on ``gs://``.

While a trainer holds a run, ``<run_dir>/owner.json`` names it (host, pid, a random token, and
the orchestrator's identity when given: ``RCPFLOW_RUN_OWNER``, else Airflow's DAG, run and task
ids from the task's environment) with its heartbeat; it is removed when training ends or the
process exits. Every change is under `Storage.update`'s lock (a generation precondition on GCS),
so two takers never both win. A lease is free when absent, stale (heartbeat older than
``RCPFLOW_LEASE_TIMEOUT_S``, default 600 s) or left by a gone process of this host; the same
owner (the same orchestrator identity, e.g. a retry of one DAG run's task; without identities,
the same process) takes it back. Anyone else is refused with one line naming the owner.
Why: docs/design.md (ownership).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
import weakref
from dataclasses import asdict, dataclass, replace

from rcpflow.files import jsonio
from rcpflow.files.layout import RunLayout, dirname, join
from rcpflow.files.storage import StorageError, pid_alive, storage_for

log = logging.getLogger(__name__)

LEASE_NAME = "owner.json"
FORMAT = "rcpflow.owner.v1"
OWNER_ENV = "RCPFLOW_RUN_OWNER"
TIMEOUT_ENV = "RCPFLOW_LEASE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
# Airflow exports these to a task's processes; a retry of the task has the same three.
_AIRFLOW_ENV = ("AIRFLOW_CTX_DAG_ID", "AIRFLOW_CTX_DAG_RUN_ID", "AIRFLOW_CTX_TASK_ID")


class RunOwnedError(StorageError):
    """The run folder is owned by another live trainer; the message names it."""


class LeaseTimeoutError(StorageError):
    """``RCPFLOW_LEASE_TIMEOUT_S`` is not a usable number of seconds; the message names it."""


class _Unchanged(Exception):
    """Nothing to write."""


def lease_path(run_dir: str) -> str:
    return join(RunLayout(run_dir).root, LEASE_NAME)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def airflow_owner(dag_id: str, run_id: str, task_id: str) -> str:
    """The owner identity of an Airflow task: the same for every try of one DAG run's task."""
    return f"airflow:{dag_id}/{run_id}/{task_id}"


def owner_from_env() -> str | None:
    """``RCPFLOW_RUN_OWNER``, else `airflow_owner` from the Airflow task's environment."""
    given = os.environ.get(OWNER_ENV, "").strip()
    if given:
        return given
    dag_id, run_id, task_id = (os.environ.get(name, "") for name in _AIRFLOW_ENV)
    return airflow_owner(dag_id, run_id, task_id) if dag_id and run_id and task_id else None


def timeout_from_env() -> float:
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 10**7:  # also refuses nan and inf
        raise LeaseTimeoutError(f"{TIMEOUT_ENV}={text!r}: not a number of seconds in (0, 1e7)")
    return value


@dataclass(frozen=True)
class Holder:
    """One holder of a lease, as written in ``owner.json``."""

    host: str
    pid: int
    token: str
    owner: str | None  # the orchestrator's identity, if any
    since_ms: int
    heartbeat_ms: int

    def describe(self) -> str:
        who = f"{self.owner} " if self.owner else ""
        return f"{who}(host {self.host}, pid {self.pid})"

    def same_owner(self, other: Holder) -> bool:
        """Two orchestrator identities decide; without both, the same process is the owner."""
        if self.owner is not None and other.owner is not None:
            return self.owner == other.owner
        return self.host == other.host and self.pid == other.pid

    def to_json(self) -> bytes:
        d = {"format": FORMAT, **asdict(self)}
        return (json.dumps(d, sort_keys=True, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Holder:
        d = jsonio.load_bytes(data, where)
        if not isinstance(d, dict) or d.pop("format", None) != FORMAT:
            raise ValueError(f"{where}: not an rcpflow lease ({FORMAT})")
        try:
            holder = cls(**d)
        except TypeError as e:
            raise ValueError(f"{where}: {e}") from e
        for name in ("pid", "since_ms", "heartbeat_ms"):
            value = getattr(holder, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{where}: {name} {value!r} is not an integer")
        if not isinstance(holder.host, str) or not isinstance(holder.token, str):
            raise ValueError(f"{where}: host and token must be strings")
        if holder.owner is not None and not isinstance(holder.owner, str):
            raise ValueError(f"{where}: owner must be a string or null")
        return holder


def _why_free(old: Holder, me: Holder, timeout_s: float, now: int) -> str | None:
    """Why `old`'s lease may be taken by `me`; None while it stands."""
    age_s = (now - old.heartbeat_ms) / 1000
    if age_s > timeout_s:
        return f"its heartbeat is {age_s:.0f} s old (timeout {timeout_s:.0f} s)"
    if old.host == me.host and old.pid != os.getpid() and not pid_alive(old.pid):
        return f"its process {old.pid} on this host is gone"
    return None


class Lease:
    """This process's hold on one run folder: `acquire`, a heartbeat thread, `release`."""

    def __init__(self, run_dir: str, owner: str | None, timeout_s: float) -> None:
        self.path = lease_path(run_dir)
        self.timeout_s = timeout_s
        t = now_ms()
        self.me = Holder(socket.gethostname(), os.getpid(), secrets.token_hex(8), owner, t, t)
        self.lost: str | None = None  # why the lease is no longer ours
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> str | None:
        """Take the lease; returns what was taken over (for the caller to say), or None.
        RunOwnedError when another live owner holds it."""
        said: list[str] = []

        def take(old: bytes | None) -> bytes:
            said.clear()
            now = now_ms()
            mine = replace(self.me, since_ms=now, heartbeat_ms=now)
            if old is None:
                return mine.to_json()
            try:
                held = Holder.from_json(old, self.path)
            except ValueError as e:
                said.append(f"replaced an unreadable lease ({e})")
                return mine.to_json()
            if held.token == self.me.token:
                return mine.to_json()
            if held.same_owner(self.me):
                said.append(f"took the lease back from the same owner {held.describe()}")
                return mine.to_json()
            why = _why_free(held, self.me, self.timeout_s, now)
            if why is None:
                age_s = (now - held.heartbeat_ms) / 1000
                raise RunOwnedError(
                    f"{dirname(self.path)}: owned by {held.describe()} since {held.since_ms}, "
                    f"heartbeat {age_s:.0f} s ago ({self.path}); a second trainer is refused "
                    f"(if that owner is gone, its lease is free once the heartbeat is "
                    f"{self.timeout_s:.0f} s old: {TIMEOUT_ENV})"
                )
            said.append(f"took over the lease of {held.describe()}: {why}")
            return mine.to_json()

        storage_for(self.path).update(self.path, take)
        self.lost = None
        return said[0] if said else None

    def refresh(self) -> None:
        """Renew the heartbeat; marks the lease `lost` when another owner has taken it."""

        def beat(old: bytes | None) -> bytes:
            held = Holder.from_json(old, self.path) if old is not None else None
            if held is None or held.token != self.me.token:
                who = held.describe() if held is not None else "nobody (the lease was removed)"
                self.lost = f"{self.path}: the run is now held by {who}"
                raise _Unchanged
            return replace(held, heartbeat_ms=now_ms()).to_json()

        with contextlib.suppress(_Unchanged):
            storage_for(self.path).update(self.path, beat)

    def release(self) -> None:
        """Remove the lease, if it is still ours: a finished folder holds no lease file."""
        self._stop.set()

        def ours(data: bytes) -> bool:
            try:
                return Holder.from_json(data, self.path).token == self.me.token
            except ValueError:
                return False

        storage_for(self.path).delete_if(self.path, ours)

    def start_heartbeat(self, interval_s: float | None = None) -> None:
        """Refresh every `interval_s` (default a fifth of the timeout) in a daemon thread, so
        that a long compile or step never lets the lease go stale; released at exit."""
        if self._thread is not None:
            return
        interval = self.timeout_s / 5 if interval_s is None else interval_s
        ref = weakref.ref(self)
        stop = self._stop

        def run() -> None:
            while not stop.wait(interval):
                lease = ref()
                if lease is None or lease.lost is not None:
                    return
                try:
                    lease.refresh()
                except (StorageError, OSError, ValueError) as e:  # transient: try next time
                    log.warning("%s: heartbeat not written: %s", lease.path, e)
                del lease

        self._thread = threading.Thread(target=run, name="rcpflow-lease", daemon=True)
        self._thread.start()
        # By path and token, not by the object: a lease dropped before exit (a job that failed
        # after taking it) is released too; one taken over since holds another token.
        atexit.register(_release_at_exit, self.path, self.me.token)


def _release_at_exit(path: str, token: str) -> None:
    """A trainer that exits (also on an error or SIGTERM) leaves its run free for a resume."""

    def ours(data: bytes) -> bool:
        try:
            return Holder.from_json(data, path).token == token
        except ValueError:
            return False

    with contextlib.suppress(Exception):
        storage_for(path).delete_if(path, ours)


def check_or_refresh(layout: RunLayout, owner: str | None) -> None:
    """For one-shot writers (`rcpflow manifest add`): with an `owner`, take or refresh the lease
    as that owner and keep it (each add is a heartbeat of a trainer that is not Python);
    without one, only check that no other live owner holds the run."""
    lease = Lease(layout.root, owner, timeout_from_env())
    if owner is not None:
        said = lease.acquire()
        if said:
            log.warning("%s: %s", lease.path, said)
        return
    try:
        data = storage_for(lease.path).read_bytes(lease.path)
    except FileNotFoundError:
        return
    try:
        held = Holder.from_json(data, lease.path)
    except ValueError:
        return  # an unreadable lease holds nothing
    live = _why_free(held, lease.me, lease.timeout_s, now_ms()) is None
    if not held.same_owner(lease.me) and live:
        raise RunOwnedError(
            f"{layout.root}: owned by {held.describe()} ({lease.path}); a row from "
            f"another writer is refused (give that owner's --owner, or {OWNER_ENV})"
        )
