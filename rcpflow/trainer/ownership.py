"""Run ownership: one trainer at a time in a run folder, on a local disk or on ``gs://``.

While a trainer holds a run, ``<run_dir>/owner.json`` names it (host, pid, a random token, and
the orchestrator's identity when given: ``RCPFLOW_RUN_OWNER``, else Airflow's DAG, run and task
ids from the task's environment) with its heartbeat; it is removed when training ends or the
process exits. Every change is under `Storage.update`'s lock (a generation precondition on GCS),
so two takers never both win. A lease is free when absent, stale (heartbeat older than
``RCPFLOW_LEASE_TIMEOUT_S``, default 600 s) or left by a gone process of this host; the same
owner (the same orchestrator identity, e.g. a retry of one DAG run's task; without identities,
the same process) takes it back. Anyone else is refused with one line naming the owner.

A holder that is not a Python trainer (`rcpflow manifest add --owner`, `rcpflow lease hold`)
is held by its heartbeat alone (``by_heartbeat``): the command's process is gone a moment
later, so its process id says nothing. A heartbeat further in the future than the timeout is
stale too (a clock that lies locks nothing for ever).

A hostile folder: locally the lease and its lock file are opened without following symlinks
and must be regular files (`LeaseFileError` names them otherwise); the lease is written by an
atomic replace inside the run folder, and a heartbeat or release never recreates a removed
run folder. Process ids are read within the platform's range (1 .. `PID_MAX`).
Why: docs/design.md (ownership).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import socket
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace

from rcpflow.files import jsonio
from rcpflow.files.layout import RunLayout, dirname
from rcpflow.files.storage import StorageError, pid_alive, read_if_present, storage_for

log = logging.getLogger(__name__)

# The lease file's format id: a literal that never follows a module move (tests/test_format_ids.py).
FORMAT = "rcpflow.owner.v1"
OWNER_ENV = "RCPFLOW_RUN_OWNER"
TIMEOUT_ENV = "RCPFLOW_LEASE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
# Airflow exports these to a task's processes; a retry of the task has the same three.
_AIRFLOW_ENV = ("AIRFLOW_CTX_DAG_ID", "AIRFLOW_CTX_DAG_RUN_ID", "AIRFLOW_CTX_TASK_ID")
PID_MAX = 2**31 - 1  # pid_t is a signed 32-bit int on every platform we run on
TIME_MS_MAX = 2**63 - 1
LEASE_MAX_BYTES = 64 * 1024  # a lease is a few hundred bytes; more is not a lease


class RunOwnedError(StorageError):
    """The run folder is owned by another live trainer; the message names it."""


class LeaseTimeoutError(StorageError):
    """``RCPFLOW_LEASE_TIMEOUT_S`` is not a usable number of seconds; the message names it."""


class LeaseFileError(RunOwnedError):
    """The lease or its lock is a symlink or not a regular file, or the run folder is gone:
    nothing is followed or written; the message names the path."""


class _Unchanged(Exception):
    """Nothing to write."""


def lease_path(run_dir: str) -> str:
    return RunLayout(run_dir).owner


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
    by_heartbeat: bool = False  # a holder that is not a process of ours: live by heartbeat only

    def describe(self) -> str:
        who = f"{self.owner} " if self.owner else ""
        if self.by_heartbeat:
            return f"{who}(host {self.host}, held by heartbeat)"
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
        if len(data) > LEASE_MAX_BYTES:
            raise ValueError(f"{where}: {len(data)} bytes, not an rcpflow lease ({FORMAT})")
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
        if not 1 <= holder.pid <= PID_MAX:
            raise ValueError(f"{where}: pid {holder.pid} is not a process id (1..{PID_MAX})")
        for name in ("since_ms", "heartbeat_ms"):
            if not 0 <= getattr(holder, name) <= TIME_MS_MAX:
                raise ValueError(f"{where}: {name} {getattr(holder, name)} is out of range")
        if not isinstance(holder.by_heartbeat, bool):
            raise ValueError(f"{where}: by_heartbeat must be true or false")
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
    if -age_s > timeout_s:
        return (
            f"its heartbeat is {-age_s:.0f} s in the future (a clock beyond the timeout "
            f"{timeout_s:.0f} s: stale)"
        )
    if old.by_heartbeat:
        return None  # its process ids say nothing: live while its heartbeat is fresh
    if old.host == me.host and old.pid != os.getpid() and not pid_alive(old.pid):
        return f"its process {old.pid} on this host is gone"
    return None


class Lease:
    """This process's hold on one run folder: `acquire`, a heartbeat thread, `release`."""

    def __init__(
        self, run_dir: str, owner: str | None, timeout_s: float, by_heartbeat: bool = False
    ) -> None:
        self.path = lease_path(run_dir)
        self.timeout_s = timeout_s
        t = now_ms()
        self.me = Holder(
            socket.gethostname(), os.getpid(), secrets.token_hex(8), owner, t, t, by_heartbeat
        )
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

        _update(self.path, take, create=True)
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

        try:
            _update(self.path, beat, create=False)
        except _Unchanged:
            pass
        except (LeaseFileError, ValueError) as e:  # a link, a folder, garbage: not ours any more
            self.lost = str(e)

    def release(self) -> None:
        """Remove the lease, if it is still ours: a finished folder holds no lease file."""
        self._stop.set()

        try:
            _delete_if(self.path, _is_token(self.path, self.me.token))
        except LeaseFileError as e:
            log.warning("lease not released: %s", e)

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

    with contextlib.suppress(Exception):
        _delete_if(path, _is_token(path, token))


def _is_token(path: str, token: str) -> Callable[[bytes], bool]:
    def ours(data: bytes) -> bool:
        try:
            return Holder.from_json(data, path).token == token
        except ValueError:
            return False

    return ours


# -- the lease file on a local disk: never through a link, never outside the run folder ----------

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _open_regular(path: str, flags: int, what: str) -> int:
    """An fd on the regular file `path`, never through a symlink; LeaseFileError naming it."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LeaseFileError(
                f"{path}: the {what} is a symlink; a lease is never followed out of the run "
                "folder (remove the link)"
            ) from e
        if e.errno in (errno.EISDIR, errno.ENXIO):
            raise LeaseFileError(f"{path}: the {what} is not a regular file") from e
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise LeaseFileError(f"{path}: the {what} is not a regular file (remove it)")
    return fd


def _folder_of(path: str, create: bool) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    if create:
        os.makedirs(folder, exist_ok=True)
    elif not os.path.isdir(folder):
        raise LeaseFileError(f"{folder}: the run folder is gone; the lease is not recreated")
    return folder


@contextlib.contextmanager
def _local_lock(path: str, create: bool) -> Iterator[None]:
    folder = _folder_of(path, create)
    lock_path = os.path.join(folder, f".{os.path.basename(path)}.lock")
    fd = _open_regular(lock_path, os.O_RDWR | os.O_CREAT, "lease's lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def _local_read(path: str) -> bytes | None:
    try:
        fd = _open_regular(path, os.O_RDONLY, "lease")
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(LEASE_MAX_BYTES + 1)


def _local_write(path: str, data: bytes) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces the name inside the folder, never a link's target
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _update(path: str, fn: Callable[[bytes | None], bytes], create: bool) -> None:
    if path.startswith("gs://"):
        storage = storage_for(path)
        if not create and not storage.exists(path):
            fn(None)  # the lease is gone: `fn` says so (raises); nothing is written
        storage.update(path, fn)
        return
    with _local_lock(path, create):
        _local_write(path, fn(_local_read(path)))


def _delete_if(path: str, condition: Callable[[bytes], bool]) -> bool:
    if path.startswith("gs://"):
        return storage_for(path).delete_if(path, condition)
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        return False  # the folder was removed: nothing to release, nothing recreated
    with _local_lock(path, create=False):
        data = _local_read(path)
        if data is None or not condition(data):
            return False
        os.unlink(path)
        return True


def check_or_refresh(layout: RunLayout, owner: str | None) -> None:
    """For one-shot writers (`rcpflow manifest add`): with an `owner`, take or refresh the lease
    as that owner and keep it (each add is a heartbeat of a trainer that is not Python);
    without one, only check that no other live owner holds the run."""
    lease = Lease(layout.root, owner, timeout_from_env(), by_heartbeat=True)
    data = _read(lease.path)
    try:
        held = Holder.from_json(data, lease.path) if data is not None else None
    except ValueError:
        held = None  # an unreadable lease holds nothing
    live = held is not None and _why_free(held, lease.me, lease.timeout_s, now_ms()) is None
    if owner is not None:
        if held is not None and live and held.same_owner(lease.me) and not held.by_heartbeat:
            # the owner's own process holds it (a Python recorder beside `manifest add`): its
            # heartbeat keeps it; taking it over would make that process think it lost the run
            return
        said = lease.acquire()
        if said:
            log.warning("%s: %s", lease.path, said)
        return
    if held is None:
        return
    if not held.same_owner(lease.me) and live:
        raise RunOwnedError(
            f"{layout.root}: owned by {held.describe()} ({lease.path}); a row from "
            f"another writer is refused (give that owner's --owner, or {OWNER_ENV})"
        )


def live_holder(run_dir: str) -> Holder | None:
    """Who holds the run now: the holder of a lease that stands (fresh heartbeat, process not
    known to be gone), else None (no lease, a stale one, an unreadable one: it holds nothing)."""
    path = lease_path(run_dir)
    data = _read(path)
    if data is None:
        return None
    try:
        held = Holder.from_json(data, path)
    except ValueError:
        return None
    me = Holder(socket.gethostname(), os.getpid(), "", None, 0, 0)
    return held if _why_free(held, me, timeout_from_env(), now_ms()) is None else None


def _read(path: str) -> bytes | None:
    """The lease's bytes, None when there is none; locally never through a link."""
    if path.startswith("gs://"):
        return read_if_present(path)
    return _local_read(path)


# -- a lease held by a trainer that is not Python: `rcpflow lease hold|renew|release` ---------


def hold(run_dir: str, owner: str, timeout_s: float) -> str | None:
    """Take the lease as `owner`, live by its heartbeat alone (renew it well within the
    timeout); what was taken over, or None. RunOwnedError naming another live holder."""
    return Lease(run_dir, owner, timeout_s, by_heartbeat=True).acquire()


def renew(run_dir: str, owner: str) -> Holder:
    """Renew `owner`'s heartbeat; RunOwnedError when the lease is not `owner`'s (taken over,
    released, or never held): that trainer must stop writing into the folder."""
    path = lease_path(run_dir)
    renewed: list[Holder] = []

    def beat(old: bytes | None) -> bytes:
        if old is None:
            raise RunOwnedError(f"{path}: no lease: {owner} does not hold the run (lease hold)")
        held = Holder.from_json(old, path)
        if held.owner != owner:
            raise RunOwnedError(f"{path}: the run is held by {held.describe()}, not {owner}")
        renewed.append(replace(held, heartbeat_ms=now_ms()))
        return renewed[-1].to_json()

    try:
        _update(path, beat, create=False)
    except ValueError as e:
        raise RunOwnedError(f"the lease is unreadable: {e}") from e
    return renewed[-1]


def release_owned(run_dir: str, owner: str) -> bool:
    """Remove the lease if `owner` holds it; False when there is none. RunOwnedError naming
    the holder when it is another's."""
    path = lease_path(run_dir)

    def owners(data: bytes) -> bool:
        try:
            return Holder.from_json(data, path).owner == owner
        except ValueError:
            return False

    if _delete_if(path, owners):
        return True
    data = _read(path) if os.path.isdir(dirname(path)) or path.startswith("gs://") else None
    if data is None:
        return False
    try:
        held = Holder.from_json(data, path).describe()
    except ValueError as e:
        held = f"an unreadable lease ({e})"
    raise RunOwnedError(f"{path}: held by {held}, not {owner}: not released")


def refuse_if_live(layout: RunLayout, what: str) -> None:
    """Refuse `what` while any live lease holds the folder, whoever holds it (a Python trainer,
    or one held by heartbeat): `rcpflow run reset`."""
    path = lease_path(layout.root)
    data = _read(path)
    if data is None:
        return
    try:
        held = Holder.from_json(data, path)
    except ValueError:
        return  # an unreadable lease holds nothing
    timeout_s = timeout_from_env()
    me = Holder(socket.gethostname(), os.getpid(), "", None, 0, 0)
    now = now_ms()
    if _why_free(held, me, timeout_s, now) is None:
        raise RunOwnedError(
            f"{layout.root}: owned by {held.describe()}, heartbeat "
            f"{(now - held.heartbeat_ms) / 1000:.0f} s ago ({path}); {what} is refused while "
            f"the lease is live (free once its heartbeat is {timeout_s:.0f} s old, or: rcpflow "
            "lease release RUN_DIR --owner NAME)"
        )
