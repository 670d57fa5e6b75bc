"""The Orbax step folder of a checkpoint: its items, its ``meta`` record, and when it is complete.

``<checkpoints_dir>/<step>/`` holds ``params/`` (scanned layout, uncompressed), ``train_state/``
and ``meta/`` (JSON: step, timestamp, weights fingerprint, the trainer's `extra`). Only a folder
with Orbax's commit marker is complete; nothing else is listed, restored or evaluated. Every
Orbax reader and writer is limited to its own process (`local_multiprocessing`; see
docs/tpu_jobs.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import flags

from rcpflow.files.layout import CHECKPOINT_STATE_DIR, join
from rcpflow.files.storage import storage_for

PARAMS_ITEM = "params"
STATE_ITEM = CHECKPOINT_STATE_DIR  # the run folder's name for it (rcpflow.files.layout)
META_ITEM = "meta"
COMMIT_MARKER = "commit_success.txt"
META_FORMAT = 1
# Defined by orbax.checkpoint (its multihost module); read when a barrier is taken.
_ORBAX_DISTRIBUTED_BARRIER_FLAG = "experimental_orbax_use_distributed_barrier"
PyTree = Any


class CheckpointError(RuntimeError):
    """A checkpoint is missing, half-written, or cannot be saved; the message names the step."""


def update_fields(d: Mapping[str, Any]) -> dict[str, Any]:
    """The weight update a checkpoint's record names (step, its time, the weights' fingerprint),
    typed; KeyError, TypeError or ValueError when one is missing or not of its type."""
    return {
        "step": int(d["step"]),
        "timestamp_ms": int(d["timestamp_ms"]),
        "weights_fingerprint": str(d["weights_fingerprint"]),
    }


@dataclass(frozen=True)
class CheckpointMeta:
    """What a checkpoint says about itself (the ``meta`` item)."""

    step: int
    timestamp_ms: int
    weights_fingerprint: str
    extra: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"format": META_FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str) -> CheckpointMeta:
        if d.get("format") != META_FORMAT:
            raise CheckpointError(f"{where}: unknown checkpoint meta format {d.get('format')!r}")
        try:
            return cls(**update_fields(d), extra=dict(d["extra"]))
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


def handlers() -> dict[str, ocp.CheckpointHandler]:
    # Uncompressed: zstd halves save/restore throughput and saves little on float weights.
    return {
        PARAMS_ITEM: ocp.PyTreeCheckpointHandler(use_compression=False),
        STATE_ITEM: ocp.PyTreeCheckpointHandler(use_compression=False),
        META_ITEM: ocp.JsonCheckpointHandler(),
    }


def barriers_off_the_devices() -> None:
    """Make Orbax's barriers (in `sync_global_processes`) wait on `jax.distributed`'s key-value
    store rather than on a device collective. A saver's thread saves while the training loop
    runs its own collectives; collectives from two threads reach the devices in a different
    order on each process (gloo aborts: "collective mismatch"). Process-wide, idempotent."""
    holder = flags.FLAGS[_ORBAX_DISTRIBUTED_BARRIER_FLAG]
    if not holder.value or not holder.present:
        holder.parse("true")


def local_multiprocessing() -> ocp.options.MultiprocessingOptions:
    """Orbax's multi-process options for a reader or writer used by this process alone: its
    barriers are skipped (in a one-process job these are Orbax's defaults)."""
    if jax.process_count() == 1:
        return ocp.options.MultiprocessingOptions()
    me = jax.process_index()
    return ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
