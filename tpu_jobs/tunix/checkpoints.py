"""Tunix's checkpoints, as this job configures (`options`), watches (`CommitWatcher`) and reads
them (`read_record`, `restore_params`).

``<checkpoint_root>/actor/<step>/`` holds ``model_params``, ``optimizer_state``,
``_CHECKPOINT_METADATA`` (with Tunix's ``custom_metadata``, where this job's `CheckpointRecord`
of the step sits under `RCPFLOW_KEY`) and ``commit_success.txt``: only a step with the marker is
committed. Why the options and the polling watcher: docs/tpu_jobs.md.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from rcpflow.files.layout import join
from rcpflow.files.storage import storage_for
from tpu_jobs.rcp.checkpoint_format import (
    COMMIT_MARKER,
    CheckpointError,
    is_complete,
    update_fields,
)

ACTOR_DIR = "actor"  # Tunix puts the actor's checkpoints under this folder of the root
PARAMS_ITEM = "model_params"
STEP_METADATA = "_CHECKPOINT_METADATA"
RCPFLOW_KEY = "rcpflow"
RECORD_FORMAT = 1
POLL_START_S = 0.005
POLL_MAX_S = 0.1


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
class CheckpointRecord:
    """What this job writes into a checkpoint's custom metadata about its step."""

    step: int
    timestamp_ms: int
    weights_fingerprint: str
    run: Mapping[str, Any]  # seed, global_batch_size, val_start_at, max_steps
    policy: Mapping[str, int]  # `tpu_jobs.tunix.policy.ModelConfig` fields

    def to_json(self) -> dict[str, Any]:
        return {"format": RECORD_FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, d: Any, where: str) -> CheckpointRecord:
        if not isinstance(d, dict) or d.get("format") != RECORD_FORMAT:
            raise CheckpointError(f"{where}: no rcpflow record of format {RECORD_FORMAT}: {d!r}")
        try:
            return cls(**update_fields(d), run=dict(d["run"]), policy=dict(d["policy"]))
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: malformed rcpflow record ({e!r})") from e


def read_record(path: str) -> tuple[int, CheckpointRecord]:
    """(Tunix's global_step, this job's record) from a committed step folder."""
    if not is_complete(path):
        raise CheckpointError(f"{path}: not a complete Tunix checkpoint (no {COMMIT_MARKER})")
    meta_path = join(path, STEP_METADATA)
    try:
        custom = json.loads(storage_for(meta_path).read_text(meta_path))["custom_metadata"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{meta_path}: unreadable step metadata ({e!r})") from e
    if RCPFLOW_KEY not in custom:
        raise CheckpointError(f"{meta_path}: custom_metadata has no {RCPFLOW_KEY!r} record")
    record = CheckpointRecord.from_json(custom[RCPFLOW_KEY], where=meta_path)
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
    if not is_complete(path):
        raise CheckpointError(f"{path}: not a complete Tunix checkpoint (no {COMMIT_MARKER})")
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
                deadline = time.monotonic() + self._timeout_s
                wait = POLL_START_S
                while not is_complete(path):
                    if time.monotonic() > deadline:
                        raise CheckpointError(
                            f"step {step}: {path} did not commit within {self._timeout_s:.0f} s"
                        )
                    time.sleep(wait)
                    wait = min(wait * 2, POLL_MAX_S)
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
