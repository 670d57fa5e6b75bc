"""Orbax checkpoints of a scanned policy: async save with a weights fingerprint, numpy restore.

One step's checkpoint is the folder ``<checkpoints_dir>/<step>/`` that Orbax's
``CheckpointManager`` writes, with three items:

    params/        the policy parameters in the SCANNED layout, as trained (uncompressed PyTree)
    train_state/   whatever else the trainer needs to resume (optimizer state, rng, ...)
    meta/          JSON: step, timestamp_ms, weights_fingerprint, and the trainer's own `extra`

Orbax writes a step into a temporary location and marks it finished last (``commit_success.txt``
in the step folder: written just before the atomic rename on a local disk, written after all
data on GCS). A step folder without that marker is half-written: it is never listed as complete,
never restored, and Orbax removes it when the next saver opens the folder.

The fingerprint (`weights_fingerprint`) is a sha256 over the parameter bytes in a canonical leaf
order. It is computed from the in-memory weights at save time, stored inside the checkpoint (so
it is committed atomically with the weights) and copied into the manifest row; `restore_params`
recomputes it on what was read and raises `FingerprintMismatchError` before anyone can score a
mis-restored model.

Saves are asynchronous, and the training loop never waits for a write: `CheckpointSaver.save`
copies the arrays to host memory (a snapshot that later updates, in place or donated, cannot
change) and queues the step; one worker thread per saver runs the Orbax saves one at a time, in
step order, each to its commit, then hands the committed step to `on_commit` (the RCP hooks
upsert the manifest row there). The loop waits only when `max_pending` steps are already queued
or writing (backpressure: at most that many snapshots held in host memory). Orbax 0.12.8 has no
option for this: `CheckpointManager.save` and `AsyncCheckpointer.save` both first wait for the
previous save to finish. A save that fails stops the queue (later steps would leave a gap in the
manifest) and every later call on the saver raises `SaveFailedError` naming the step.

Restore for evaluation reads the ``params`` item as numpy arrays; the eval model then takes
per-layer views of the stacked arrays (`tpu_jobs.model.unscan_params`), so no weight is copied
between the read and the model.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

# gcsfs (which etils/Orbax use for gs:// folders) otherwise probes each bucket over gRPC for a
# hierarchical namespace, which waits up to 60 s when no credentials exist (the emulator case).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import orbax.checkpoint as ocp
from etils import epath

from rcpflow.layout import join
from rcpflow.storage import storage_for

PARAMS_ITEM = "params"
STATE_ITEM = "train_state"
META_ITEM = "meta"
COMMIT_MARKER = "commit_success.txt"
FINGERPRINT_ALGORITHM = "sha256"
META_FORMAT = 1
# Two snapshots absorb one save slower than a step without stalling the loop, for one extra copy
# of params + state in host memory. Raise it when saves outlast steps only for a short while.
DEFAULT_MAX_PENDING = 2

PyTree = Any


class CheckpointError(RuntimeError):
    """A checkpoint is missing, half-written, or its save failed; the message names the step."""


class FingerprintMismatchError(CheckpointError):
    """The restored weights are not the weights that were saved."""


class SaveFailedError(CheckpointError):
    """A queued save failed in the background; the saver accepts no more saves."""


@dataclass(frozen=True)
class CheckpointMeta:
    """What a checkpoint says about itself (the ``meta`` item)."""

    step: int
    timestamp_ms: int
    weights_fingerprint: str
    extra: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": META_FORMAT,
            "step": self.step,
            "timestamp_ms": self.timestamp_ms,
            "weights_fingerprint": self.weights_fingerprint,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str) -> CheckpointMeta:
        if d.get("format") != META_FORMAT:
            raise CheckpointError(f"{where}: unknown checkpoint meta format {d.get('format')!r}")
        try:
            return cls(
                step=int(d["step"]),
                timestamp_ms=int(d["timestamp_ms"]),
                weights_fingerprint=str(d["weights_fingerprint"]),
                extra=dict(d["extra"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: malformed checkpoint meta ({e!r})") from e


@dataclass(frozen=True)
class SavedCheckpoint:
    """A save that has fully finished (committed on storage)."""

    step: int
    path: str
    meta: CheckpointMeta


def _leaf_name(path: jax.tree_util.KeyPath) -> str:
    return jax.tree_util.keystr(path, simple=True, separator="/")


def weights_fingerprint(params: PyTree) -> str:
    """``sha256:<hex>`` over every leaf's name, dtype, shape and bytes, leaves sorted by name.

    Independent of the container types (dict, FrozenDict) and of where the arrays live (JAX
    device arrays are read to host; numpy views are hashed as their logical contents).
    """
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    named = sorted(((_leaf_name(p), leaf) for p, leaf in leaves), key=lambda item: item[0])
    names = [name for name, _ in named]
    if len(set(names)) != len(names):
        raise ValueError("weights_fingerprint: two parameter leaves have the same name")
    digest = hashlib.sha256()
    for name, leaf in named:
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update(f"{name}|{array.dtype.str}|{array.shape}\n".encode())
        digest.update(array.reshape(-1).view(np.uint8))
    return f"{FINGERPRINT_ALGORITHM}:{digest.hexdigest()}"


def is_complete(step_path: str) -> bool:
    """True if the checkpoint folder `step_path` was fully written (Orbax's commit marker)."""
    return storage_for(step_path).exists(join(step_path, COMMIT_MARKER))


def _handlers() -> dict[str, ocp.CheckpointHandler]:
    # Uncompressed: zstd halves save/restore throughput and saves little on float weights.
    return {
        PARAMS_ITEM: ocp.PyTreeCheckpointHandler(use_compression=False),
        STATE_ITEM: ocp.PyTreeCheckpointHandler(use_compression=False),
        META_ITEM: ocp.JsonCheckpointHandler(),
    }


def _numpy_restore_args(tree_metadata: PyTree) -> PyTree:
    return jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree_metadata)


def host_snapshot(tree: PyTree, what: str) -> PyTree:
    """`tree` with every array leaf copied into a numpy array that owns its memory.

    What a background save may hold on to: a JAX array passed in may be donated or (on CPU, where
    ``np.asarray`` is a view of the device buffer) reused by the next update, but this copy is
    read by nobody else. Other leaves (Python scalars, strings) are immutable and kept as they are.
    Arrays spread over several hosts cannot be copied here and are refused by name.
    """
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    for _, leaf in leaves:
        if isinstance(leaf, jax.Array) and leaf.is_fully_addressable:
            leaf.copy_to_host_async()  # start every transfer before waiting on the first

    def copy(path: jax.tree_util.KeyPath, leaf: Any) -> Any:
        if isinstance(leaf, jax.Array):
            name = f"{what}/{_leaf_name(path)}"
            if not leaf.is_fully_addressable:
                raise CheckpointError(
                    f"{name}: array spans several hosts; host snapshots need it on this one"
                )
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                raise CheckpointError(
                    f"{name}: typed PRNG key; save jax.random.key_data(key) instead"
                )
        if isinstance(leaf, jax.Array | np.ndarray):
            return np.array(leaf, copy=True)
        return leaf

    return jax.tree_util.tree_map_with_path(copy, tree)


@dataclass(frozen=True)
class _Job:
    step: int
    params: PyTree  # host snapshots (`host_snapshot`)
    state: PyTree
    timestamp_ms: int
    extra: Mapping[str, Any]


class CheckpointSaver:
    """Step checkpoints under one folder (local path or ``gs://``), written in the background.

    `save` returns once the arrays are copied to host memory; one worker thread writes the queued
    steps in order, each to its Orbax commit, then calls ``on_commit(saved)`` (in that thread, in
    step order, before the next step's write starts). `wait` blocks until the queue is empty.
    """

    def __init__(
        self,
        directory: str,
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        on_commit: Callable[[SavedCheckpoint], None] | None = None,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self.directory = directory.rstrip("/") if directory.startswith("gs://") else directory
        self.max_pending = max_pending
        self._on_commit = on_commit
        # Synchronous Orbax saves: the worker thread is the asynchrony; an Orbax background
        # thread on top would only add a thread per save and more CPU.
        # cleanup_tmp_directories: a save cut short by a crash left a half-written step folder;
        # Orbax removes it before this saver's first save, so the step can be saved again.
        self._manager = ocp.CheckpointManager(
            epath.Path(self.directory),
            item_handlers=_handlers(),
            options=ocp.CheckpointManagerOptions(
                cleanup_tmp_directories=True,
                enable_async_checkpointing=False,
                save_root_metadata=False,
            ),
        )
        self._manager_lock = threading.Lock()  # the worker's save vs. the caller's reads
        self._steps_on_open = frozenset(self._manager.all_steps())
        self._cond = threading.Condition()
        # Guarded by _cond: steps queued or writing (the head is the one writing), committed steps
        # not yet returned by `wait`, the first failure, the worker if one runs.
        self._queue: deque[_Job] = deque()
        self._committed: list[SavedCheckpoint] = []
        self._failure: tuple[str, BaseException] | None = None
        self._worker: threading.Thread | None = None
        self._last_step: int | None = None
        self._closed = False

    def step_path(self, step: int) -> str:
        return join(self.directory, str(step))

    def complete_steps(self) -> list[int]:
        """Steps whose checkpoint is fully written, ascending (re-read from storage)."""
        with self._manager_lock:
            self._manager.reload()
            steps = sorted(self._manager.all_steps())
        return [s for s in steps if is_complete(self.step_path(s))]

    def save(
        self,
        step: int,
        params: PyTree,
        state: PyTree,
        *,
        timestamp_ms: int,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue step `step`: `params` (scanned) and `state` are copied to host memory before this
        returns, so the caller may then donate or overwrite them. Blocks only while `max_pending`
        saves are unfinished. Steps must increase from call to call. Raises `SaveFailedError` if an
        earlier save failed."""
        with self._cond:
            self._raise_if_failed()
            if self._closed:
                raise CheckpointError(f"step {step}: save() after close()")
            if self._last_step is not None and step <= self._last_step:
                raise CheckpointError(
                    f"step {step}: saves must be in increasing step order (last was "
                    f"{self._last_step})"
                )
            if step in self._steps_on_open:
                raise CheckpointError(
                    f"step {step}: a complete checkpoint already exists at {self.step_path(step)}"
                )
            while len(self._queue) >= self.max_pending and self._failure is None:
                self._cond.wait()
            self._raise_if_failed()
        try:
            job = _Job(
                step=step,
                params=host_snapshot(params, PARAMS_ITEM),
                state=host_snapshot(state, STATE_ITEM),
                timestamp_ms=timestamp_ms,
                extra=dict(extra or {}),
            )
        except CheckpointError as e:
            raise CheckpointError(f"step {step}: {e}") from e
        with self._cond:
            self._raise_if_failed()
            self._queue.append(job)
            self._last_step = step
            if self._worker is None:
                # A daemon: Orbax cannot write once interpreter shutdown has begun (its executors
                # refuse work), so a process that exits without wait() drops the queued saves as
                # a crash would (no commit, no row). It exits whenever the queue is empty.
                self._worker = threading.Thread(
                    target=self._work, name=f"checkpoint-saver:{self.directory}", daemon=True
                )
                self._worker.start()

    def pending(self) -> list[int]:
        """Steps queued or being written, ascending."""
        with self._cond:
            return [job.step for job in self._queue]

    def wait(self) -> list[SavedCheckpoint]:
        """Block until every queued save has committed; return the committed saves not yet
        returned, ascending. Raises `SaveFailedError` if one failed."""
        with self._cond:
            while self._queue and self._failure is None:
                self._cond.wait()
            self._raise_if_failed()
            done, self._committed = self._committed, []
            return done

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
                job = self._queue[0]  # stays pending (counted by max_pending) until committed
            stage = "write"
            try:
                saved = self._write(job)
                stage = "on_commit"
                if self._on_commit is not None:
                    self._on_commit(saved)
            except BaseException as e:
                with self._cond:
                    dropped = [j.step for j in self._queue if j.step != job.step]
                    what = (
                        "could not be saved"
                        if stage == "write"
                        else f"was committed at {self.step_path(job.step)} but on_commit failed"
                    )
                    self._failure = (
                        f"step {job.step}: checkpoint {what}: {e!r}"
                        + (
                            f"; steps {dropped} were queued after it and not saved"
                            if dropped
                            else ""
                        )
                        + "; the saver accepts no more saves",
                        e,
                    )
                    self._queue.clear()
                    self._worker = None
                    self._cond.notify_all()
                return
            with self._cond:
                self._queue.popleft()
                self._committed.append(saved)
                self._cond.notify_all()

    def _write(self, job: _Job) -> SavedCheckpoint:
        meta = CheckpointMeta(
            step=job.step,
            timestamp_ms=job.timestamp_ms,
            weights_fingerprint=weights_fingerprint(job.params),
            extra=job.extra,
        )
        with self._manager_lock:
            saved = self._manager.save(
                job.step,
                args=ocp.args.Composite(
                    **{
                        PARAMS_ITEM: ocp.args.PyTreeSave(job.params),
                        STATE_ITEM: ocp.args.PyTreeSave(job.state),
                        META_ITEM: ocp.args.JsonSave(meta.to_json()),
                    }
                ),
                force=True,
            )
        if not saved:
            raise CheckpointError(f"step {job.step}: Orbax declined to save this step")
        path = self.step_path(job.step)
        # Orbax logs (rather than raises) some commit failures: trust only the marker.
        if not is_complete(path):
            raise CheckpointError(
                f"step {job.step}: save ended but {path} has no {COMMIT_MARKER} (the write "
                "failed; see the Orbax log above)"
            )
        return SavedCheckpoint(step=job.step, path=path, meta=meta)

    def read_meta(self, step: int) -> CheckpointMeta:
        return read_meta(self.step_path(step))

    def restore_train_state(
        self, step: int, params_like: PyTree, state_like: PyTree
    ) -> tuple[PyTree, PyTree, CheckpointMeta]:
        """Restore step `step` for resuming training, as arrays shaped/sharded like the targets.

        The weights are checked against the fingerprint recorded at save time.
        """
        path = self.step_path(step)
        if not is_complete(path):
            raise CheckpointError(f"step {step}: {path} is not a complete checkpoint")
        with self._manager_lock:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    **{
                        PARAMS_ITEM: ocp.args.PyTreeRestore(
                            item=params_like,
                            restore_args=ocp.checkpoint_utils.construct_restore_args(params_like),
                        ),
                        STATE_ITEM: ocp.args.PyTreeRestore(
                            item=state_like,
                            restore_args=ocp.checkpoint_utils.construct_restore_args(state_like),
                        ),
                        META_ITEM: ocp.args.JsonRestore(),
                    }
                ),
            )
        meta = CheckpointMeta.from_json(restored[META_ITEM], where=path)
        verify_fingerprint(restored[PARAMS_ITEM], meta.weights_fingerprint, where=path)
        return restored[PARAMS_ITEM], restored[STATE_ITEM], meta

    def close(self) -> None:
        """Let the queued saves finish (committed ones stay returned by `wait`), close Orbax's
        manager; raises `SaveFailedError` if a save failed. Idempotent."""
        with self._cond:
            self._closed = True
            while self._queue and self._failure is None:
                self._cond.wait()
        with self._manager_lock:
            self._manager.close()
        with self._cond:
            self._raise_if_failed()


def _reader() -> ocp.Checkpointer:
    # All items registered, even those a caller does not restore, so Orbax does not warn about
    # an item it cannot handle.
    return ocp.Checkpointer(ocp.CompositeCheckpointHandler(**_handlers()))


def read_meta(step_path: str) -> CheckpointMeta:
    """The ``meta`` item of a complete checkpoint folder."""
    if not is_complete(step_path):
        raise CheckpointError(f"{step_path}: not a complete checkpoint (no {COMMIT_MARKER})")
    restored = _reader().restore(
        epath.Path(step_path), args=ocp.args.Composite(**{META_ITEM: ocp.args.JsonRestore()})
    )
    return CheckpointMeta.from_json(restored[META_ITEM], where=step_path)


def verify_fingerprint(params: PyTree, expected: str, where: str) -> None:
    got = weights_fingerprint(params)
    if got != expected:
        raise FingerprintMismatchError(
            f"{where}: restored weights have fingerprint {got}, expected {expected}: the "
            "checkpoint is not the one recorded (or was corrupted); refusing to use it"
        )


def restore_params(
    step_path: str, expected_fingerprint: str | None = None
) -> tuple[PyTree, CheckpointMeta]:
    """Read the scanned params of a complete checkpoint as numpy arrays and verify them.

    `expected_fingerprint` is the manifest row's; without one (standalone evaluation) the
    checkpoint's own recorded fingerprint is the reference. Raises `CheckpointError` (or its
    subclass `FingerprintMismatchError`) naming the checkpoint.
    """
    if not is_complete(step_path):
        raise CheckpointError(f"{step_path}: not a complete checkpoint (no {COMMIT_MARKER})")
    reader = _reader()
    path = epath.Path(step_path)
    try:
        tree_metadata = reader.metadata(path).item_metadata[PARAMS_ITEM].tree
        restored = reader.restore(
            path,
            args=ocp.args.Composite(
                **{
                    PARAMS_ITEM: ocp.args.PyTreeRestore(
                        restore_args=_numpy_restore_args(tree_metadata)
                    ),
                    META_ITEM: ocp.args.JsonRestore(),
                }
            ),
        )
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"{step_path}: restore failed: {e!r}") from e
    meta = CheckpointMeta.from_json(restored[META_ITEM], where=step_path)
    if expected_fingerprint is not None and expected_fingerprint != meta.weights_fingerprint:
        raise FingerprintMismatchError(
            f"{step_path}: checkpoint records fingerprint {meta.weights_fingerprint}, the "
            f"manifest expects {expected_fingerprint}: not the checkpoint the manifest recorded"
        )
    params = restored[PARAMS_ITEM]
    verify_fingerprint(params, expected_fingerprint or meta.weights_fingerprint, where=step_path)
    return params, meta
