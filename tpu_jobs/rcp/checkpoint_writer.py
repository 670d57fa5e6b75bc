"""Collective step checkpoints (`tpu_jobs.rcp.checkpoint_format`) under one folder.

Every process of the job calls `CheckpointSaver.save` for the same steps. `save` only queues the
step (the arrays as they are, and its fingerprint's pending device computation); a worker thread
on each process then makes the async Orbax save, in which each process writes its own shards,
one step at a time in step order. On process 0 (`primary`) the worker also waits for the step's
commit marker and hands the committed step to ``on_commit`` (its manifest row). The loop waits
only while `max_pending` steps are queued or saving. A save without a train state is an
evaluation checkpoint (params and meta only); `drop_state` deletes a step's train state later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from rcpflow.files.layout import join
from rcpflow.files.storage import storage_for
from tpu_jobs.rcp.checkpoint_format import (
    META_ITEM,
    PARAMS_ITEM,
    STATE_ITEM,
    CheckpointError,
    CheckpointMeta,
    SavedCheckpoint,
    barriers_off_the_devices,
    handlers,
    is_complete,
)
from tpu_jobs.rcp.checkpoint_restore import read_meta
from tpu_jobs.rcp.fingerprint import PendingFingerprint, start_fingerprint, verify_fingerprint
from tpu_jobs.rcp.saver import OrderedSaveQueue

# Steps queued or saving (their arrays held by the saver) before `save` waits for the oldest.
DEFAULT_MAX_PENDING = 2
COMMIT_TIMEOUT_S = 1800.0
POLL_START_S = 0.005
POLL_MAX_S = 0.1

PyTree = Any


def _wait_for_commit(path: str, step: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    wait = POLL_START_S
    while not is_complete(path):
        if time.monotonic() > deadline:
            raise CheckpointError(
                f"step {step}: {path} did not commit within {timeout_s:.0f} s (see the Orbax "
                "log above)"
            )
        time.sleep(wait)
        wait = min(wait * 2, POLL_MAX_S)


@dataclass(frozen=True)
class _SaveJob:
    step: int
    params: PyTree
    state: PyTree | None
    timestamp_ms: int
    extra: Mapping[str, Any]
    fingerprint: str | PendingFingerprint


class CheckpointSaver:
    """Step checkpoints under one folder (local path or ``gs://``), saved by every process.

    `save` returns once the step is queued; the arrays it was given are held (not copied) until
    Orbax has its host copies, so a trainer must not donate them to a later step.
    ``on_commit(saved)`` runs on process 0 in the worker's thread, in step order, once the
    step's commit marker is there. `wait` blocks until every save has committed (and, on
    process 0, been handed on).
    """

    def __init__(
        self,
        directory: str,
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        on_commit: Callable[[SavedCheckpoint], None] | None = None,
        commit_timeout_s: float = COMMIT_TIMEOUT_S,
    ) -> None:
        self.directory = directory.rstrip("/") if directory.startswith("gs://") else directory
        self.primary = jax.process_index() == 0
        self.max_pending = max_pending
        self._commit_timeout_s = commit_timeout_s
        if jax.process_count() > 1:
            barriers_off_the_devices()  # this saver's thread takes Orbax's barriers
        self._queue: OrderedSaveQueue[_SaveJob, SavedCheckpoint] = OrderedSaveQueue(
            self._write,
            max_pending=max_pending,
            on_commit=on_commit if self.primary else None,
            thread_name=f"checkpoint-saves:{self.directory}",
        )
        # cleanup_tmp_directories: a save cut short by a crash left a half-written step folder;
        # Orbax removes it before this saver's first save, so the step can be saved again.
        self._manager = ocp.CheckpointManager(
            epath.Path(self.directory),
            item_handlers=handlers(),
            options=ocp.CheckpointManagerOptions(
                create=True,
                cleanup_tmp_directories=True,
                enable_async_checkpointing=True,
                save_root_metadata=False,
            ),
        )
        self._manager_lock = threading.Lock()
        # The steps on storage as of the last reload, and those saved since: `save` refuses
        # one of them without asking Orbax (whose lock the worker may hold).
        self._known_steps = set(self._manager.all_steps())
        self._closed = False

    def step_path(self, step: int) -> str:
        return join(self.directory, str(step))

    def complete_steps(self) -> list[int]:
        """Steps whose checkpoint is fully written, ascending (re-read from storage)."""
        self.reload()
        return [s for s in sorted(self._known_steps) if is_complete(self.step_path(s))]

    def has_state(self, step: int) -> bool:
        """Whether step `step`'s checkpoint holds the train state (a resume point)."""
        path = join(self.step_path(step), STATE_ITEM)
        return storage_for(path).exists(join(path, "_METADATA"))

    def save(
        self,
        step: int,
        params: PyTree,
        state: PyTree | None,
        *,
        timestamp_ms: int,
        extra: Mapping[str, Any] | None = None,
        fingerprint: str | PendingFingerprint | None = None,
    ) -> None:
        """Queue step `step` on every process: `params` (scanned) and `state` (None: an
        evaluation checkpoint without train state) as they are sharded. Blocks only while
        `max_pending` steps are unfinished. `fingerprint` is that of `params` if the caller
        has started it (`start_fingerprint`; started here otherwise: a collective). Steps must
        increase; raises `SaveFailedError` if an earlier save failed."""
        if self._closed:
            raise CheckpointError(f"step {step}: save() after close()")
        self._queue.check(step)
        if step in self._known_steps:
            raise CheckpointError(f"step {step}: {self.step_path(step)} exists; not saved again")
        job = _SaveJob(
            step=step,
            params=params,
            state=state,
            timestamp_ms=timestamp_ms,
            extra=dict(extra or {}),
            fingerprint=start_fingerprint(params) if fingerprint is None else fingerprint,
        )
        self._queue.put(step, lambda: job)
        self._known_steps.add(step)

    def _write(self, job: _SaveJob) -> SavedCheckpoint:
        fingerprint = job.fingerprint
        meta = CheckpointMeta(
            step=job.step,
            timestamp_ms=job.timestamp_ms,
            weights_fingerprint=(
                fingerprint if isinstance(fingerprint, str) else fingerprint.result()
            ),
            extra=job.extra,
        )
        items: dict[str, Any] = {
            PARAMS_ITEM: ocp.args.PyTreeSave(job.params),
            META_ITEM: ocp.args.JsonSave(meta.to_json()),
        }
        if job.state is not None:
            items[STATE_ITEM] = ocp.args.PyTreeSave(job.state)
        with self._manager_lock:
            try:
                saved = self._manager.save(job.step, args=ocp.args.Composite(**items), force=True)
            except ValueError as e:  # Orbax refuses a step that exists
                raise CheckpointError(f"step {job.step}: {e}") from e
        if not saved:
            raise CheckpointError(f"step {job.step}: Orbax declined to save this step")
        record = SavedCheckpoint(step=job.step, path=self.step_path(job.step), meta=meta)
        return self._watch(record) if self.primary else record

    def _watch(self, record: SavedCheckpoint) -> SavedCheckpoint:
        _wait_for_commit(record.path, record.step, self._commit_timeout_s)
        return record

    @property
    def waited_s(self) -> float:
        """`save`'s time waiting for room in the queue (saves outlasting steps), in all."""
        return self._queue.waited_s

    def pending(self) -> list[int]:
        """Steps queued or saving (on process 0: until handed on), ascending."""
        return self._queue.pending()

    def wait(self) -> list[SavedCheckpoint]:
        """Block until every save has committed (every process) and, on process 0, has been
        handed on; return those not yet returned. Raises `SaveFailedError` if one failed."""
        done = self._queue.wait()
        with self._manager_lock:
            self._manager.wait_until_finished()
        return done

    def read_meta(self, step: int) -> CheckpointMeta:
        return read_meta(self.step_path(step))

    def delete(self, step: int) -> None:
        """Remove step `step`'s checkpoint (process 0; to be saved again). Other processes must
        `reload` before their next read."""
        if self.pending():
            raise CheckpointError(f"step {step}: cannot delete a checkpoint while saves are queued")
        path = epath.Path(self.step_path(step))
        if path.exists():
            path.rmtree()
        self.reload()

    def drop_state(self, step: int) -> None:
        """Delete step `step`'s train state, keeping its weights for evaluation (process 0)."""
        path = epath.Path(join(self.step_path(step), STATE_ITEM))
        if path.exists():
            path.rmtree()

    def reload(self) -> None:
        with self._manager_lock:
            self._manager.reload()
            self._known_steps = set(self._manager.all_steps())

    def restore_train_state(
        self, step: int, params_like: PyTree, state_like: PyTree, *, verify: bool = True
    ) -> tuple[PyTree, PyTree, CheckpointMeta]:
        """Restore step `step` for resuming training (every process: each reads its shards of
        the targets' shardings). With `verify` the weights are checked against the recorded
        fingerprint (a collective: without it, the caller verifies)."""
        path = self.step_path(step)
        if not is_complete(path):
            raise CheckpointError(f"step {step}: {path} is not a complete checkpoint")
        if not self.has_state(step):
            raise CheckpointError(f"step {step}: {path} holds no {STATE_ITEM} (weights only)")
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
        if verify:
            verify_fingerprint(restored[PARAMS_ITEM], meta.weights_fingerprint, where=path)
        return restored[PARAMS_ITEM], restored[STATE_ITEM], meta

    def close(self) -> None:
        """Let the saves finish and their commits be handed on, close Orbax's manager; raises
        `SaveFailedError` if a save failed. Idempotent."""
        self._closed = True
        try:
            self._queue.close()
            with self._manager_lock:
                self._manager.wait_until_finished()
        finally:
            with self._manager_lock:
                self._manager.close()
