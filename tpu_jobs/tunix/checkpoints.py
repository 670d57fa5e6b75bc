"""Tunix's checkpoints, as this job configures (`options`), watches (`CommitWatcher`) and reads
them (`read_record`, `restore_params`).

``<checkpoint_root>/actor/<step>/`` holds ``model_params``, ``optimizer_state``,
``_CHECKPOINT_METADATA`` (with Tunix's ``custom_metadata``, where this job's `CheckpointRecord`
of the step sits under `RCPFLOW_KEY`) and ``commit_success.txt``: only a step with the marker is
committed. Why the options and the polling watcher: docs/tpu_jobs.md.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from rcpflow.files.layout import join
from rcpflow.files.storage import storage_for
from tpu_jobs.rcp.checkpoint_format import COMMIT_MARKER, CheckpointError
from tpu_jobs.rcp.native_checkpoints import (
    StepRecord,
    metadata_path,
    read_custom_metadata,
    require_complete,
    wait_for_commit,
)

ACTOR_DIR = "actor"  # Tunix puts the actor's checkpoints under this folder of the root
PARAMS_ITEM = "model_params"
TUNIX_CHECKPOINT = "Tunix checkpoint"  # what the errors call a step folder


def options(val_start_at: int, max_steps: int) -> ocp.CheckpointManagerOptions:
    """Save every step from `val_start_at` to `max_steps` (none before), delete none, async."""
    return ocp.CheckpointManagerOptions(
        save_decision_policy=ocp.checkpoint_managers.SpecificStepsPolicy(
            steps=list(range(val_start_at, max_steps + 1))
        ),
        max_to_keep=None,
        enable_async_checkpointing=True,
        cleanup_tmp_directories=True,
    )


def actor_dir(checkpoint_root: str) -> str:
    return join(checkpoint_root, ACTOR_DIR)


def step_path(checkpoint_root: str, step: int) -> str:
    return join(actor_dir(checkpoint_root), str(step))


def complete_steps(checkpoint_root: str) -> list[int]:
    """Committed actor steps, ascending; half-written ones (no marker, tmp folders) are not."""
    folder = actor_dir(checkpoint_root)
    storage = storage_for(folder)
    steps = set()
    for path in storage.list(folder):
        rel = path[len(folder) :].strip("/").split("/")
        if len(rel) == 2 and rel[0].isdigit() and rel[1] == COMMIT_MARKER:
            steps.add(int(rel[0]))
    return sorted(steps)


@dataclass(frozen=True)
class CheckpointRecord(StepRecord):
    """What this job writes into a checkpoint's custom metadata about its step."""

    policy: Mapping[str, int]  # `tpu_jobs.tunix.policy.ModelConfig` fields

    @classmethod
    def own_fields(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        return {"policy": dict(d["policy"])}


def read_record(path: str) -> tuple[int, CheckpointRecord]:
    """(Tunix's global_step, this job's record) from a committed step folder."""
    custom = read_custom_metadata(path, TUNIX_CHECKPOINT)
    record = CheckpointRecord.in_metadata(custom, metadata_path(path))
    return int(custom["global_step"]), record


def _unwrap(tree: Any) -> Any:
    # Tunix saves nnx state: each parameter is a {"value": array} node.
    if isinstance(tree, dict):
        if set(tree) == {"value"} and not isinstance(tree["value"], dict):
            return tree["value"]
        return {k: _unwrap(v) for k, v in tree.items()}
    return tree


def restore_params(path: str) -> dict[str, Any]:
    """The actor's parameters of a committed step folder, as a nested dict of numpy arrays."""
    require_complete(path, TUNIX_CHECKPOINT)
    item = epath.Path(path) / PARAMS_ITEM
    reader = ocp.PyTreeCheckpointer()
    try:
        tree = reader.metadata(item).item_metadata.tree
        restored = reader.restore(
            item,
            args=ocp.args.PyTreeRestore(
                restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
            ),
        )
    except Exception as e:
        raise CheckpointError(f"{path}: restore of {PARAMS_ITEM} failed: {e!r}") from e
    return _unwrap(restored)


class CommitWatcher:
    """Waits, in its own thread, for each expected step to commit; then calls `on_commit`.

    Steps are handed on in the order `expect` received them (Orbax saves them in that order).
    A failure in `on_commit` stops the watcher; `drain` raises it in the caller's thread.
    """

    def __init__(
        self, checkpoint_root: str, on_commit: Callable[[int, str], None], timeout_s: float = 600.0
    ) -> None:
        self.checkpoint_root = checkpoint_root
        self._on_commit = on_commit
        self._timeout_s = timeout_s
        self._cond = threading.Condition()
        self._queue: deque[int] = deque()
        self._failure: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tunix-commit-watch", daemon=True)
        self._thread.start()

    def expect(self, step: int) -> None:
        with self._cond:
            self._raise_if_failed()
            self._queue.append(step)
            self._cond.notify_all()

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise CheckpointError(f"recording a committed checkpoint failed: {self._failure!r}")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                step = self._queue[0]
            try:
                path = step_path(self.checkpoint_root, step)
                wait_for_commit(path, step, self._timeout_s)
                self._on_commit(step, path)
            except BaseException as e:
                with self._cond:
                    self._failure = e
                    self._queue.clear()
                    self._cond.notify_all()
                return
            with self._cond:
                self._queue.popleft()
                self._cond.notify_all()

    def drain(self) -> None:
        """Block until every expected step has been handed on; raise a watcher failure."""
        with self._cond:
            while self._queue and self._failure is None:
                self._cond.wait()
            self._raise_if_failed()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
