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

Saves are asynchronous: `CheckpointSaver.save` returns once the arrays are snapshotted, the
write and commit run in Orbax's background thread. Orbax keeps at most one save in flight (the
next `save` first waits for the previous one); `poll` reports the saves that have finished since
the last call and `wait` blocks for all of them.

Restore for evaluation reads the ``params`` item as numpy arrays; the eval model then takes
per-layer views of the stacked arrays (`tpu_jobs.model.unscan_params`), so no weight is copied
between the read and the model.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

# gcsfs (which etils/Orbax use for gs:// folders) otherwise probes each bucket over gRPC for a
# hierarchical namespace, which waits up to 60 s when no credentials exist (the emulator case).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import orbax.checkpoint as ocp  # noqa: E402  (after the gcsfs setting above)
from etils import epath  # noqa: E402

from rcpflow.layout import join  # noqa: E402
from rcpflow.storage import storage_for  # noqa: E402

PARAMS_ITEM = "params"
STATE_ITEM = "train_state"
META_ITEM = "meta"
COMMIT_MARKER = "commit_success.txt"
FINGERPRINT_ALGORITHM = "sha256"
META_FORMAT = 1

PyTree = Any


class CheckpointError(RuntimeError):
    """A checkpoint is missing, half-written, or its save failed; the message names the step."""


class FingerprintMismatchError(CheckpointError):
    """The restored weights are not the weights that were saved."""


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
        digest.update(memoryview(array).cast("B"))
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


class CheckpointSaver:
    """Asynchronous step checkpoints under one folder (local path or ``gs://``)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory.rstrip("/") if directory.startswith("gs://") else directory
        # cleanup_tmp_directories: a save cut short by a crash left a half-written step folder;
        # Orbax removes it before this saver's first save, so the step can be saved again.
        self._manager = ocp.CheckpointManager(
            epath.Path(self.directory),
            item_handlers=_handlers(),
            options=ocp.CheckpointManagerOptions(
                cleanup_tmp_directories=True,
                enable_async_checkpointing=True,
                save_root_metadata=False,
            ),
        )
        self._pending: dict[int, CheckpointMeta] = {}

    def step_path(self, step: int) -> str:
        return join(self.directory, str(step))

    def complete_steps(self) -> list[int]:
        """Steps whose checkpoint is fully written, ascending (re-read from storage)."""
        self._manager.reload()
        return [s for s in sorted(self._manager.all_steps()) if is_complete(self.step_path(s))]

    def save(
        self,
        step: int,
        params: PyTree,
        state: PyTree,
        *,
        timestamp_ms: int,
        extra: Mapping[str, Any] | None = None,
    ) -> CheckpointMeta:
        """Start saving `params` (scanned) and `state` as step `step`; returns without waiting for
        the write. `params` and `state` must stay alive (not donated) until `save` returns."""
        if step in self._pending:
            raise CheckpointError(f"step {step}: a save of this step is already in flight")
        meta = CheckpointMeta(
            step=step,
            timestamp_ms=timestamp_ms,
            weights_fingerprint=weights_fingerprint(params),
            extra=dict(extra or {}),
        )
        try:
            saved = self._manager.save(
                step,
                args=ocp.args.Composite(
                    **{
                        PARAMS_ITEM: ocp.args.PyTreeSave(params),
                        STATE_ITEM: ocp.args.PyTreeSave(state),
                        META_ITEM: ocp.args.JsonSave(meta.to_json()),
                    }
                ),
                force=True,
            )
        except ocp.checkpoint_manager.StepAlreadyExistsError as e:
            raise CheckpointError(
                f"step {step}: a complete checkpoint already exists at {self.step_path(step)}"
            ) from e
        except Exception as e:
            # The previous step's save failed in the background; its error surfaces here.
            raise CheckpointError(
                f"step {step}: could not start the save (an earlier save failed?): {e}"
            ) from e
        if not saved:
            raise CheckpointError(f"step {step}: Orbax declined to save this step")
        self._pending[step] = meta
        return meta

    def in_flight(self) -> list[int]:
        return sorted(self._pending)

    def poll(self) -> list[SavedCheckpoint]:
        """Saves that finished since the last call, ascending by step; never blocks on a write.

        Orbax runs one save at a time, so every pending step but the newest has finished once
        the newest was started; the newest is finished when no save is in progress.
        """
        if not self._pending:
            return []
        newest = max(self._pending)
        done = [s for s in self._pending if s != newest]
        if not self._manager.is_saving_in_progress():
            done.append(newest)
        return self._collect(sorted(done))

    def wait(self) -> list[SavedCheckpoint]:
        """Block until every started save has finished; return those not yet reported."""
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            raise CheckpointError(f"steps {self.in_flight()}: a background save failed: {e}") from e
        return self._collect(self.in_flight())

    def _collect(self, steps: list[int]) -> list[SavedCheckpoint]:
        finished = []
        for step in steps:
            path = self.step_path(step)
            # Orbax logs (rather than raises) some commit failures: trust only the marker.
            if not is_complete(path):
                raise CheckpointError(
                    f"step {step}: save ended but {path} has no {COMMIT_MARKER} "
                    "(the write failed; see the Orbax log above)"
                )
            finished.append(SavedCheckpoint(step=step, path=path, meta=self._pending.pop(step)))
        return finished

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
        """Wait for the save in flight (its result stays reported by `wait`/`poll`) and close."""
        self._manager.close()


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
