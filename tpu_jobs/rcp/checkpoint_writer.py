"""Orbax checkpoints of a scanned policy: the step folder's layout, its save, and restores.

A step's checkpoint is ``<checkpoints_dir>/<step>/`` with the items ``params/`` (scanned layout,
uncompressed), ``train_state/`` and ``meta/`` (JSON: step, timestamp, weights fingerprint, the
trainer's `extra`). Only a folder with Orbax's commit marker is complete; anything else is never
listed, restored or evaluated. Saves are queued on host snapshots (`tpu_jobs.saver`); restores
for evaluation read numpy arrays and verify the fingerprint (`tpu_jobs.fingerprint`).

In a job of several processes (`tpu_jobs.distributed`) every Orbax reader and writer here is
limited to its own process (`local_multiprocessing`): process 0 alone writes, from the host
copy of the replicated arrays, and no save or read waits on a barrier of the other processes.
"""

from __future__ import annotations

import os
import threading
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
from tpu_jobs.fingerprint import (
    FingerprintMismatchError,
    leaf_name,
    verify_fingerprint,
    weights_fingerprint,
)
from tpu_jobs.saver import OrderedSaveQueue

PARAMS_ITEM = "params"
STATE_ITEM = "train_state"
META_ITEM = "meta"
COMMIT_MARKER = "commit_success.txt"
META_FORMAT = 1
# Two snapshots absorb one save slower than a step without stalling the loop, for one extra copy
# of params + state in host memory. Raise it when saves outlast steps only for a short while.
DEFAULT_MAX_PENDING = 2

PyTree = Any


class CheckpointError(RuntimeError):
    """A checkpoint is missing, half-written, or cannot be saved; the message names the step."""


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


def local_multiprocessing() -> ocp.options.MultiprocessingOptions:
    """Orbax's multi-process options for a reader or writer used by this process alone: its
    barriers are skipped (in a one-process job these are Orbax's defaults)."""
    if jax.process_count() == 1:
        return ocp.options.MultiprocessingOptions()
    me = jax.process_index()
    return ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})


def _numpy_restore_args(tree_metadata: PyTree) -> PyTree:
    return jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree_metadata)


def host_snapshot(tree: PyTree, what: str) -> PyTree:
    """`tree` with every array leaf copied into a numpy array that owns its memory.

    What a background save may hold on to: a JAX array passed in may be donated or (on CPU, where
    ``np.asarray`` is a view of the device buffer) reused by the next update, but this copy is
    read by nobody else. Other leaves (Python scalars, strings) are immutable and kept as they are.
    An array replicated over several processes is copied from this process's replica; one split
    over several hosts cannot be copied here and is refused by name.
    """
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    for _, leaf in leaves:
        if isinstance(leaf, jax.Array) and leaf.is_fully_addressable:
            leaf.copy_to_host_async()  # start every transfer before waiting on the first

    def copy(path: jax.tree_util.KeyPath, leaf: Any) -> Any:
        if isinstance(leaf, jax.Array):
            name = f"{what}/{leaf_name(path)}"
            if not leaf.is_fully_addressable:
                if not leaf.is_fully_replicated:
                    raise CheckpointError(
                        f"{name}: array is split over several hosts; host snapshots need a "
                        "whole copy on this one"
                    )
                leaf = leaf.addressable_data(0)
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                raise CheckpointError(
                    f"{name}: typed PRNG key; save jax.random.key_data(key) instead"
                )
        if isinstance(leaf, jax.Array | np.ndarray):
            return np.array(leaf, copy=True)
        return leaf

    return jax.tree_util.tree_map_with_path(copy, tree)


@dataclass(frozen=True)
class StepSnapshot:
    """One queued save: host copies (`host_snapshot`) of a step's params and state."""

    step: int
    params: PyTree
    state: PyTree
    timestamp_ms: int
    extra: Mapping[str, Any]


class CheckpointSaver:
    """Step checkpoints under one folder (local path or ``gs://``), written in the background.

    `save` returns once the arrays are copied to host memory; the queue (`OrderedSaveQueue`)
    writes the steps in order, each to its Orbax commit, then calls ``on_commit(saved)`` (in its
    thread, in step order, before the next step's write starts). `wait` blocks until it is empty.
    """

    def __init__(
        self,
        directory: str,
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        on_commit: Callable[[SavedCheckpoint], None] | None = None,
    ) -> None:
        self.directory = directory.rstrip("/") if directory.startswith("gs://") else directory
        self._queue: OrderedSaveQueue[StepSnapshot, SavedCheckpoint] = OrderedSaveQueue(
            self._write,
            max_pending=max_pending,
            on_commit=on_commit,
            thread_name=f"checkpoint-saver:{self.directory}",
        )
        self.max_pending = max_pending
        # Synchronous Orbax saves: the queue's thread is the asynchrony; an Orbax background
        # thread on top would only add a thread per save and more CPU. Orbax 0.12.8 offers no
        # bounded queue of its own: its async save first waits for the previous save to finish.
        # cleanup_tmp_directories: a save cut short by a crash left a half-written step folder;
        # Orbax removes it before this saver's first save, so the step can be saved again.
        # Orbax refuses create=True for a manager of a subset of processes: make it here.
        epath.Path(self.directory).mkdir(parents=True, exist_ok=True)
        self._manager = ocp.CheckpointManager(
            epath.Path(self.directory),
            item_handlers=_handlers(),
            options=ocp.CheckpointManagerOptions(
                create=False,
                cleanup_tmp_directories=True,
                enable_async_checkpointing=False,
                save_root_metadata=False,
                multiprocessing_options=local_multiprocessing(),
            ),
        )
        self._manager_lock = threading.Lock()  # the worker's save vs. the caller's reads
        self._steps_on_open = frozenset(self._manager.all_steps())

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
        self._queue.check(step)  # a failed save, close() or the step order are named first
        if step in self._steps_on_open:
            raise CheckpointError(
                f"step {step}: a complete checkpoint already exists at {self.step_path(step)}"
            )

        def snapshot() -> StepSnapshot:
            try:
                return StepSnapshot(
                    step=step,
                    params=host_snapshot(params, PARAMS_ITEM),
                    state=host_snapshot(state, STATE_ITEM),
                    timestamp_ms=timestamp_ms,
                    extra=dict(extra or {}),
                )
            except CheckpointError as e:
                raise CheckpointError(f"step {step}: {e}") from e

        self._queue.put(step, snapshot)

    def pending(self) -> list[int]:
        """Steps queued or being written, ascending."""
        return self._queue.pending()

    def wait(self) -> list[SavedCheckpoint]:
        """Block until every queued save has committed; return the committed saves not yet
        returned, ascending. Raises `SaveFailedError` if one failed."""
        return self._queue.wait()

    def _write(self, job: StepSnapshot) -> SavedCheckpoint:
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

    def delete(self, step: int) -> None:
        """Remove step `step`'s checkpoint (one that cannot be restored), so it can be saved
        again. Only before the first `save`."""
        if self.pending():
            raise CheckpointError(f"step {step}: cannot delete a checkpoint while saves are queued")
        with self._manager_lock:
            self._manager.delete(step)
            self._manager.reload()
        self._steps_on_open = self._steps_on_open - {step}

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
        try:
            self._queue.close()
        finally:
            with self._manager_lock:
                self._manager.close()


def _reader() -> ocp.Checkpointer:
    # All items registered, even those a caller does not restore, so Orbax does not warn about
    # an item it cannot handle.
    return ocp.Checkpointer(
        ocp.CompositeCheckpointHandler(**_handlers()),
        multiprocessing_options=local_multiprocessing(),
    )


def read_meta(step_path: str) -> CheckpointMeta:
    """The ``meta`` item of a complete checkpoint folder."""
    if not is_complete(step_path):
        raise CheckpointError(f"{step_path}: not a complete checkpoint (no {COMMIT_MARKER})")
    restored = _reader().restore(
        epath.Path(step_path), args=ocp.args.Composite(**{META_ITEM: ocp.args.JsonRestore()})
    )
    return CheckpointMeta.from_json(restored[META_ITEM], where=step_path)


def check_readable(step_path: str) -> None:
    """Read every item of a complete checkpoint on its own terms (its own tree metadata, numpy
    arrays) and verify the weights against its recorded fingerprint; raises naming the folder.

    Tells a checkpoint that is broken on storage from one that does not fit what a caller tries
    to restore it into (another model): the second reads fine here.
    """
    if not is_complete(step_path):
        raise CheckpointError(f"{step_path}: not a complete checkpoint (no {COMMIT_MARKER})")
    reader = _reader()
    path = epath.Path(step_path)
    try:
        items = reader.metadata(path).item_metadata
        restored = reader.restore(
            path,
            args=ocp.args.Composite(
                **{
                    item: ocp.args.PyTreeRestore(restore_args=_numpy_restore_args(items[item].tree))
                    for item in (PARAMS_ITEM, STATE_ITEM)
                },
                **{META_ITEM: ocp.args.JsonRestore()},
            ),
        )
        meta = CheckpointMeta.from_json(restored[META_ITEM], where=step_path)
        verify_fingerprint(restored[PARAMS_ITEM], meta.weights_fingerprint, where=step_path)
    except (CheckpointError, FingerprintMismatchError):
        raise
    except Exception as e:  # whatever Orbax or tensorstore raise on a broken folder
        raise CheckpointError(f"{step_path}: cannot be read: {e!r}") from e


def restore_params(
    step_path: str, expected_fingerprint: str | None = None
) -> tuple[PyTree, CheckpointMeta]:
    """Read the scanned params of a complete checkpoint as numpy arrays and verify them.

    `expected_fingerprint` is the manifest row's; without one (standalone evaluation) the
    checkpoint's own recorded fingerprint is the reference. Raises `CheckpointError` or
    `FingerprintMismatchError` naming the checkpoint.
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


def restore_train_state_numpy(
    step_path: str, params_like: PyTree, state_like: PyTree
) -> tuple[PyTree, PyTree]:
    """Params and train state of a complete checkpoint as numpy arrays in the trees of
    `params_like`/`state_like` (what a process that does not own the saver resumes from); the
    weights are checked against the recorded fingerprint."""
    if not is_complete(step_path):
        raise CheckpointError(f"{step_path}: not a complete checkpoint (no {COMMIT_MARKER})")
    restored = _reader().restore(
        epath.Path(step_path),
        args=ocp.args.Composite(
            **{
                PARAMS_ITEM: ocp.args.PyTreeRestore(
                    item=params_like, restore_args=_numpy_restore_args(params_like)
                ),
                STATE_ITEM: ocp.args.PyTreeRestore(
                    item=state_like, restore_args=_numpy_restore_args(state_like)
                ),
                META_ITEM: ocp.args.JsonRestore(),
            }
        ),
    )
    meta = CheckpointMeta.from_json(restored[META_ITEM], where=step_path)
    verify_fingerprint(restored[PARAMS_ITEM], meta.weights_fingerprint, where=step_path)
    return restored[PARAMS_ITEM], restored[STATE_ITEM]
