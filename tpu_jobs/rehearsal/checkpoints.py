"""The rehearsal trainer's checkpoints: ``<run_dir>/checkpoints/<step>/checkpoint.json``.

A small real file per saved step, written atomically (local or ``gs://``): the run it belongs
to, its step, samples and weight-update time, and its "weights" (the seed, the step and how
many of the 251 tasks the checkpoint solves) with their fingerprint, a sha256 of the weights'
canonical JSON, which the manifest row records too. The evaluator reads the weights back and
refuses a checkpoint that is missing, not a rehearsal checkpoint, of another step or run, or
whose weights do not hash to the fingerprint recorded for them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from rcpflow.files import jsonio
from rcpflow.files.layout import RunLayout, join
from rcpflow.files.storage import storage_for
from rcpflow.records.run_identity import FLAGS, RunIdentity

FORMAT = "rcpflow-rehearsal-checkpoint/1"
FILE_NAME = "checkpoint.json"


class RehearsalCheckpointError(ValueError):
    """Not a usable rehearsal checkpoint; the message names the file and why."""


class FingerprintMismatchError(RehearsalCheckpointError):
    """The weights are not the ones recorded for the checkpoint."""


@dataclass(frozen=True)
class Weights:
    """What a checkpoint of the rehearsal "learned": the tasks it solves."""

    seed: int
    step: int
    solved_tasks: int

    @property
    def fingerprint(self) -> str:
        canonical = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Checkpoint:
    run: RunIdentity
    step: int
    samples_count: int
    timestamp_ms: int  # the step's weight update
    weights: Weights
    weights_fingerprint: str

    def to_json(self) -> bytes:
        record = {"format": FORMAT, **asdict(self), "run": self.run.arguments()}
        return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()


def checkpoint_dir(run_dir: str, step: int) -> str:
    return RunLayout(run_dir).checkpoint(step)


def write_checkpoint(run_dir: str, checkpoint: Checkpoint) -> str:
    """Write the step's file (atomically: it exists whole or not at all); its folder."""
    folder = checkpoint_dir(run_dir, checkpoint.step)
    path = join(folder, FILE_NAME)
    storage_for(path).write_atomic(path, checkpoint.to_json())
    return folder


def _field(d: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise RehearsalCheckpointError(f"{where}: {key} is {value!r}, not a {kind.__name__}")
    return value


def read_checkpoint(folder: str) -> Checkpoint:
    """The checkpoint in `folder`, its weights checked against its own fingerprint."""
    path = join(folder, FILE_NAME)
    storage = storage_for(path)
    if not storage.exists(path):
        raise RehearsalCheckpointError(f"{path}: no rehearsal checkpoint there")
    try:
        d = jsonio.load_bytes(storage.read_bytes(path), path)
    except jsonio.JSONInputError as e:
        raise RehearsalCheckpointError(str(e)) from e
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        found = d.get("format") if isinstance(d, dict) else type(d).__name__
        raise RehearsalCheckpointError(f"{path}: format {found!r} is not {FORMAT}")
    run, weights = _field(d, "run", dict, path), _field(d, "weights", dict, path)
    checkpoint = Checkpoint(
        run=RunIdentity(
            **{k: _field(run, k, int, f"{path}: run") for k in FLAGS}, run_start_ms=None
        ),
        step=_field(d, "step", int, path),
        samples_count=_field(d, "samples_count", int, path),
        timestamp_ms=_field(d, "timestamp_ms", int, path),
        weights=Weights(
            **{k: _field(weights, k, int, f"{path}: weights") for k in Weights.__dataclass_fields__}
        ),
        weights_fingerprint=_field(d, "weights_fingerprint", str, path),
    )
    if checkpoint.weights.fingerprint != checkpoint.weights_fingerprint:
        raise FingerprintMismatchError(
            f"{path}: the weights hash to {checkpoint.weights.fingerprint}, the checkpoint "
            f"records {checkpoint.weights_fingerprint}"
        )
    return checkpoint


def complete_steps(run_dir: str) -> list[int]:
    """Steps with a checkpoint file under ``checkpoints/``, ascending."""
    root = RunLayout(run_dir).checkpoints_dir
    steps = set()
    for path in storage_for(root).list(root):
        parts = path.rstrip("/").split("/")
        if len(parts) >= 2 and parts[-1] == FILE_NAME and parts[-2].isdigit():
            steps.add(int(parts[-2]))
    return sorted(steps)
