"""Read, list and atomically write the small files of a run, on a local disk or on GCS.

One interface for both so that the manifest and the MLLOG have one code path. Writes are atomic
(a reader never sees half a file) and `update` is a read-modify-write that is safe against a
concurrent writer: a lock plus rename locally, a generation precondition with retries on GCS.
Checkpoints are not written here (Orbax/tensorstore do that); only the files the contract owns.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import socket
import stat
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from rcpflow.files.layout import is_gcs

if TYPE_CHECKING:
    import google.cloud.storage as storage

Updater = Callable[[bytes | None], bytes]


class StorageError(Exception):
    """A storage operation failed for a reason the caller cannot fix by retrying."""


class Storage(ABC):
    @abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """The content of `path`; FileNotFoundError if it does not exist."""

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8")

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def subfolders(self, prefix: str) -> list[str]:
        """Names of the folders directly under `prefix`, sorted ([] when there is none)."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Full paths of the files under `prefix` (recursively), sorted."""

    @abstractmethod
    def write_atomic(self, path: str, data: bytes) -> None:
        """Replace `path` with `data` so that a reader sees the old or the new file, never a mix."""

    @abstractmethod
    def update(self, path: str, fn: Updater) -> bytes:
        """Replace `path` with ``fn(old)`` (old is None if absent) without losing a concurrent
        update; `fn` may be called more than once. Returns what was written."""

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove `path` if it exists."""

    @abstractmethod
    def delete_if(self, path: str, condition: Callable[[bytes], bool]) -> bool:
        """Remove `path` if it exists and ``condition(content)`` holds, with no concurrent
        update in between (the same lock or precondition as `update`); whether it was removed."""


class LocalStorage(Storage):
    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def subfolders(self, prefix: str) -> list[str]:
        try:
            with os.scandir(prefix) as entries:
                return sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def list(self, prefix: str) -> list[str]:
        if os.path.isfile(prefix):
            return [prefix]
        found: list[str] = []
        for dirpath, _, files in os.walk(prefix):
            # Dot files are our own lock and temp files (see `_locked`, `write_atomic`).
            found.extend(os.path.join(dirpath, f) for f in files if not f.startswith("."))
        return sorted(found)

    def write_atomic(self, path: str, data: bytes) -> None:
        # Through a symlink to its target, so that a symlinked log stays a link.
        target = os.path.realpath(path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _remove_dead_temps(target)
        try:
            mode: int | None = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            mode = None
        fd, tmp = _create_temp(target)
        try:
            with os.fdopen(fd, "wb") as f:
                if mode is not None:
                    os.fchmod(f.fileno(), mode)  # a replaced file keeps its mode
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def _locked(self, path: str) -> Iterator[None]:
        # A sidecar lock file: the data file itself is replaced by rename, so locking it would
        # lock an inode that the next writer no longer sees.
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        lock_path = os.path.join(directory, f".{os.path.basename(path)}.lock")
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def update(self, path: str, fn: Updater) -> bytes:
        path = os.path.realpath(path)  # one lock per file, whichever link it is reached by
        with self._locked(path):
            old = self.read_bytes(path) if os.path.exists(path) else None
            new = fn(old)
            self.write_atomic(path, new)
            return new

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def delete_if(self, path: str, condition: Callable[[bytes], bool]) -> bool:
        path = os.path.realpath(path)
        with self._locked(path):
            try:
                data = self.read_bytes(path)
            except FileNotFoundError:
                return False
            if not condition(data):
                return False
            os.unlink(path)
            return True


# Temp files: `.<name>.<host>.<pid>.<random>.tmp` beside the file they replace. A writer killed
# between creating and renaming one (SIGKILL, power loss) leaves it behind; the next write of the
# same file removes those of this host whose process is gone. A live writer's is never touched.
_HOST = socket.gethostname()
_TEMP_SUFFIX = ".tmp"


def _create_temp(target: str) -> tuple[int, str]:
    directory, name = os.path.split(target)
    while True:
        tmp = os.path.join(
            directory, f".{name}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}{_TEMP_SUFFIX}"
        )
        try:
            # Mode 0o666 and no chmod: the kernel applies the umask (and a default ACL), as
            # for any file a program creates; mkstemp would give 0o600 whatever the umask.
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another thread of ours is writing
    if not 0 < pid < 2**31:  # 0 and negatives name process groups; beyond pid_t: no process
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _remove_dead_temps(target: str) -> None:
    directory, name = os.path.split(target)
    prefix = f".{name}."
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        if not (entry.startswith(prefix) and entry.endswith(_TEMP_SUFFIX)):
            continue
        host_pid = entry[len(prefix) : -len(_TEMP_SUFFIX)].rpartition(".")[0]  # less the random
        host, _, pid = host_pid.rpartition(".")
        if host == _HOST and pid.isdigit() and not pid_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, entry))


def split_gcs(path: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> (``bucket``, ``a/b``)."""
    if not is_gcs(path):
        raise ValueError(f"not a gs:// path: {path!r}")
    bucket, _, name = path[len("gs://") :].partition("/")
    if not bucket:
        raise ValueError(f"gs:// path without a bucket: {path!r}")
    return bucket, name


class GCSStorage(Storage):
    """google-cloud-storage; honours ``STORAGE_EMULATOR_HOST`` (the client does)."""

    def __init__(self, max_attempts: int = 20, backoff_s: float = 0.05) -> None:
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s

    @property
    def client(self) -> storage.Client:
        return _gcs_client(os.environ.get("STORAGE_EMULATOR_HOST", ""))

    def _blob(self, path: str) -> storage.Blob:
        bucket, name = split_gcs(path)
        return self.client.bucket(bucket).blob(name)

    def read_bytes(self, path: str) -> bytes:
        from google.api_core.exceptions import NotFound

        with _gcs_errors(path):
            try:
                return self._blob(path).download_as_bytes()
            except NotFound as e:
                raise FileNotFoundError(path) from e

    def exists(self, path: str) -> bool:
        with _gcs_errors(path):
            return self._blob(path).exists()

    def subfolders(self, prefix: str) -> list[str]:
        bucket, name = split_gcs(prefix)
        folder = name.rstrip("/") + "/" if name.strip("/") else ""
        with _gcs_errors(prefix):
            blobs = self.client.list_blobs(bucket, prefix=folder, delimiter="/")
            for _ in blobs.pages:  # the prefixes are known once every page is read
                pass
            return sorted(p[len(folder) :].rstrip("/") for p in blobs.prefixes)

    def list(self, prefix: str) -> list[str]:
        bucket, name = split_gcs(prefix)
        folder = name.rstrip("/")
        # Folder semantics, as on a local disk: listing gs://b/run must not return gs://b/run2/x.
        with _gcs_errors(prefix):
            return sorted(
                f"gs://{bucket}/{b.name}"
                for b in self.client.list_blobs(bucket, prefix=folder)
                if not folder or b.name == folder or b.name.startswith(folder + "/")
            )

    def write_atomic(self, path: str, data: bytes) -> None:
        # A GCS object upload is atomic: readers see the old or the new generation.
        with _gcs_errors(path):
            self._blob(path).upload_from_string(data)

    def update(self, path: str, fn: Updater) -> bytes:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        old: bytes | None
        with _gcs_errors(path):
            for attempt in range(self.max_attempts):
                blob = self._blob(path)
                try:
                    generation, old = _pinned_read(blob)
                except NotFound:
                    generation, old = 0, None  # 0: succeed only if it still does not exist
                except PreconditionFailed:
                    continue
                new = fn(old)
                try:
                    blob.upload_from_string(new, if_generation_match=generation)
                    return new
                except PreconditionFailed:
                    time.sleep(self.backoff_s * (attempt + 1))
        raise StorageError(
            f"{path}: gave up after {self.max_attempts} conflicting concurrent updates"
        )

    def delete(self, path: str) -> None:
        from google.api_core.exceptions import NotFound

        with _gcs_errors(path), contextlib.suppress(NotFound):
            self._blob(path).delete()

    def delete_if(self, path: str, condition: Callable[[bytes], bool]) -> bool:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        with _gcs_errors(path):
            for attempt in range(self.max_attempts):
                blob = self._blob(path)
                try:
                    generation, data = _pinned_read(blob)
                    if not condition(data):
                        return False
                    blob.delete(if_generation_match=generation)
                    return True
                except NotFound:
                    return False
                except PreconditionFailed:
                    time.sleep(self.backoff_s * (attempt + 1))
        raise StorageError(f"{path}: gave up after {self.max_attempts} conflicting updates")

    def create_if_absent(self, path: str, data: bytes) -> int | None:
        """Create the object only if none exists (``ifGenerationMatch=0``, a lock's create):
        its generation, or None when one exists."""
        from google.api_core.exceptions import PreconditionFailed

        with _gcs_errors(path):
            blob = self._blob(path)
            try:
                blob.upload_from_string(data, if_generation_match=0)
            except PreconditionFailed:
                return None
            return int(blob.generation)

    def delete_generation(self, path: str, generation: int) -> bool:
        """Delete the object only at `generation`; whether it was deleted (False: gone or
        rewritten meanwhile)."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        with _gcs_errors(path):
            try:
                self._blob(path).delete(if_generation_match=generation)
            except (NotFound, PreconditionFailed):
                return False
            return True


def gcs_objects(prefix: str, page_size: int) -> Iterator[tuple[str, int, int]]:
    """(path, size, generation) of each object under the folder `prefix`, one page of
    `page_size` per request and streamed: a listing of thousands of objects is never held."""
    bucket, name = split_gcs(prefix)
    folder = name.rstrip("/") + "/"
    with _gcs_errors(prefix):
        blobs = _GCS.client.list_blobs(bucket, prefix=folder, page_size=page_size)
        for page in blobs.pages:
            for b in page:
                yield f"gs://{bucket}/{b.name}", int(b.size or 0), int(b.generation)


# GCS's JSON API takes at most 100 calls in one batch request.
GCS_BATCH_LIMIT = 100


def delete_generations(objects: Sequence[tuple[str, int]]) -> list[int]:
    """Delete each gs:// object ``(path, generation)`` only at its generation, in batch requests
    of at most GCS_BATCH_LIMIT calls (`Client.batch`); each object's HTTP status, in order: 2xx
    deleted, 404 already gone, 412 rewritten meanwhile, anything else not deleted. A failed
    call fails only its own object (the batch does not raise for it)."""
    statuses: list[int] = []
    client = _GCS.client
    for first in range(0, len(objects), GCS_BATCH_LIMIT):
        chunk = objects[first : first + GCS_BATCH_LIMIT]
        with _gcs_errors(chunk[0][0]):
            batch = client.batch(raise_exception=False)
            with batch:
                for path, generation in chunk:
                    _GCS._blob(path).delete(if_generation_match=generation)
            # finish() (run on leaving the block) keeps its per-call responses here; its return
            # value is out of reach inside a with, and a second finish() would send it again
            statuses += [r.status_code for r in batch._responses]
    return statuses


def _pinned_read(blob: storage.Blob) -> tuple[int, bytes]:
    """The blob's generation and its bytes at that generation; NotFound when it does not exist,
    PreconditionFailed when it changed between the two reads."""
    blob.reload()
    generation: int = blob.generation
    return generation, blob.download_as_bytes(if_generation_match=generation)


@contextlib.contextmanager
def _gcs_errors(path: str) -> Iterator[None]:
    """Google's auth and API failures (no credentials, 403, ...) as a StorageError naming the
    path: bad configuration the caller must fix, not a crash. NotFound is handled where it
    means "absent"; PreconditionFailed where it means "changed meanwhile"."""
    from google.api_core.exceptions import GoogleAPICallError
    from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError

    try:
        yield
    except DefaultCredentialsError as e:
        raise StorageError(
            f"{path}: no Google Cloud credentials (set GOOGLE_APPLICATION_CREDENTIALS or run "
            f"`gcloud auth application-default login`; STORAGE_EMULATOR_HOST for an emulator): "
            f"{' '.join(str(e).split())}"
        ) from e
    except (GoogleAPICallError, GoogleAuthError) as e:
        raise StorageError(f"{path}: {type(e).__name__}: {' '.join(str(e).split())}") from e


@lru_cache(maxsize=4)
def _gcs_client(emulator_host: str) -> storage.Client:
    import google.cloud.storage as storage

    if emulator_host:
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project="emulator", credentials=AnonymousCredentials())
    return storage.Client()


_LOCAL = LocalStorage()
_GCS = GCSStorage()


def storage_for(path: str) -> Storage:
    """The storage that holds `path`."""
    return _GCS if is_gcs(path) else _LOCAL


def read_if_present(path: str) -> bytes | None:
    """The bytes of the file or object at `path`; None when there is none."""
    try:
        return storage_for(path).read_bytes(path)
    except FileNotFoundError:
        return None
