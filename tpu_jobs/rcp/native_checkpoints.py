"""A trainer's own checkpoints with rcpflow's record of the step inside (MaxText's, Tunix's).

The trainer's checkpointer (Orbax underneath) writes the step folder; its
``_CHECKPOINT_METADATA`` carries the trainer's ``custom_metadata``, where the job puts its
record of the step (`StepRecord`, a subclass per trainer) under `RCPFLOW_KEY`, in the same
atomic commit. Only a folder with Orbax's commit marker is complete (`require_complete`);
`wait_for_commit` polls for it (the trainers' async saves say nothing when they commit).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Self

from rcpflow.files.layout import join
from rcpflow.files.storage import storage_for
from tpu_jobs.rcp.checkpoint_format import (
    COMMIT_MARKER,
    CheckpointError,
    is_complete,
    update_fields,
)

STEP_METADATA = "_CHECKPOINT_METADATA"
RCPFLOW_KEY = "rcpflow"
RECORD_FORMAT = 1
POLL_START_S = 0.005
POLL_MAX_S = 0.1


def require_complete(step_folder: str, what: str = "checkpoint") -> None:
    """Raise `CheckpointError` unless `step_folder` has committed (`what`: for the message)."""
    if not is_complete(step_folder):
        raise CheckpointError(f"{step_folder}: not a complete {what} (no {COMMIT_MARKER})")


def metadata_path(step_folder: str) -> str:
    return join(step_folder, STEP_METADATA)


def read_custom_metadata(step_folder: str, what: str = "checkpoint") -> dict[str, Any]:
    """The ``custom_metadata`` of a committed step folder."""
    require_complete(step_folder, what)
    path = metadata_path(step_folder)
    try:
        custom = json.loads(storage_for(path).read_text(path))["custom_metadata"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: unreadable step metadata ({e!r})") from e
    if not isinstance(custom, dict):
        raise CheckpointError(f"{path}: custom_metadata is not an object: {custom!r}")
    return custom


@dataclass(frozen=True)
class StepRecord:
    """What a job writes into a checkpoint's custom metadata about its step: the update (step,
    its time, the weights' fingerprint) and the run's arguments; a trainer's subclass adds its
    own fields and types them in `own_fields`."""

    step: int
    timestamp_ms: int
    weights_fingerprint: str
    run: Mapping[str, Any]  # seed, global_batch_size, val_start_at, max_steps

    def to_json(self) -> dict[str, Any]:
        return {"format": RECORD_FORMAT, **asdict(self)}

    @classmethod
    def own_fields(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        """The subclass's fields of a record's JSON, typed; KeyError, TypeError or ValueError
        when one is missing or not of its type."""
        return {}

    @classmethod
    def from_json(cls, d: Any, where: str) -> Self:
        if not isinstance(d, dict) or d.get("format") != RECORD_FORMAT:
            raise CheckpointError(f"{where}: no rcpflow record of format {RECORD_FORMAT}: {d!r}")
        try:
            return cls(**update_fields(d), run=dict(d["run"]), **cls.own_fields(d))
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: malformed rcpflow record ({e!r})") from e

    @classmethod
    def in_metadata(cls, custom: Mapping[str, Any], where: str) -> Self:
        """The record in a step's ``custom_metadata`` (read from `where`)."""
        if RCPFLOW_KEY not in custom:
            raise CheckpointError(f"{where}: custom_metadata has no {RCPFLOW_KEY!r} record")
        return cls.from_json(custom[RCPFLOW_KEY], where=where)


def wait_for_commit(path: str, step: int, timeout_s: float) -> None:
    """Poll until step `step`'s folder `path` has committed (backing off to `POLL_MAX_S`);
    `CheckpointError` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    wait = POLL_START_S
    while not is_complete(path):
        if time.monotonic() > deadline:
            raise CheckpointError(f"step {step}: {path} did not commit within {timeout_s:.0f} s")
        time.sleep(wait)
        wait = min(wait * 2, POLL_MAX_S)
