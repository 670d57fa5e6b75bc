"""What one evaluation is of (`Target`), what an evaluator must provide (`CheckpointLoader`),
and the check that a checkpoint is the one its manifest row names (`checked_facts`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tpu_jobs.eval.shards import Record


@dataclass(frozen=True)
class Target:
    """What is being evaluated and where the results go."""

    checkpoint_path: str
    expected_fingerprint: str | None  # the manifest row's; standalone: the checkpoint's own
    step: int | None  # known from the manifest row; standalone: read from the checkpoint
    timestamp_ms: int | None
    samples_count: int | None
    target_accuracy: float
    summary_path: str
    attempts_dir: str


@dataclass(frozen=True)
class CheckpointFacts:
    """Step, weight-update time and samples of a checkpoint; -1 where a failed restore left them
    unknown (standalone mode learns them from the checkpoint)."""

    step: int
    timestamp_ms: int
    samples_count: int

    @classmethod
    def of_target(cls, target: Target) -> CheckpointFacts:
        return cls(
            step=-1 if target.step is None else target.step,
            timestamp_ms=-1 if target.timestamp_ms is None else target.timestamp_ms,
            samples_count=-1 if target.samples_count is None else target.samples_count,
        )


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A restored checkpoint whose weights were verified, ready to be sampled."""

    facts: CheckpointFacts  # what the checkpoint records about itself
    attempts: Callable[[Sequence[int]], list[Record]]  # instances -> one record per attempt


class CheckpointLoader(Protocol):
    """One trainer's checkpoints, as the evaluator reads them."""

    # Rows per sampler call (part of the sampling settings a shard is identified by).
    batch_rows: int
    # Whether a worker may be several processes: `load` and the attempts are then called on
    # every process of one jax.distributed system (collectives), raising on all or none.
    multi_process: bool

    def load(self, path: str, expected_fingerprint: str | None) -> LoadedCheckpoint:
        """Restore `path` and verify its weights (against `expected_fingerprint` when given);
        raises naming the checkpoint."""
        ...


def checked_facts(target: Target, recorded: CheckpointFacts) -> CheckpointFacts:
    """The checkpoint's facts, which must be the manifest row's (step, weight-update time and
    samples) when the target has one; a ValueError naming both otherwise."""
    if target.step is None:
        return recorded
    row = CheckpointFacts.of_target(target)
    if recorded != row:
        raise ValueError(
            f"{target.checkpoint_path}: holds step {recorded.step} at {recorded.timestamp_ms} ms "
            f"({recorded.samples_count} samples), the manifest row is step {row.step} at "
            f"{row.timestamp_ms} ms ({row.samples_count} samples)"
        )
    return recorded
