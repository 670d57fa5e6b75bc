"""Background saves of step checkpoints (`tpu_jobs.rcp.checkpoint_format`) under one folder.

`CheckpointSaver.save` returns once params and state are copied to host memory
(`host_snapshot`); the queue (`tpu_jobs.rcp.saver`) writes the steps in order, each to its Orbax
commit, then hands the committed save on. The saver also restores a step for resuming training.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from rcpflow.layout import join
from tpu_jobs.rcp.checkpoint_format import (
    COMMIT_MARKER,
    META_ITEM,
    PARAMS_ITEM,
    STATE_ITEM,
    CheckpointError,
    CheckpointMeta,
    SavedCheckpoint,
    handlers,
    is_complete,
    local_multiprocessing,
)
from tpu_jobs.rcp.checkpoint_restore import read_meta
from tpu_jobs.rcp.fingerprint import leaf_name, verify_fingerprint, weights_fingerprint
from tpu_jobs.rcp.saver import OrderedSaveQueue

# Two snapshots absorb one save slower than a step without stalling the loop, for one extra copy
# of params + state in host memory. Raise it when saves outlast steps only for a short while.
DEFAULT_MAX_PENDING = 2

PyTree = Any


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
            item_handlers=handlers(),
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
