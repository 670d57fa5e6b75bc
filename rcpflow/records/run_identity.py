"""Which run a record belongs to: the identity a trainer knows about its own run.

A stop request names it in full (`rcpflow.verdict.stop_request`); a checkpoint records its
`arguments` (the four values the trainer's flags set), so a rerun with other flags is refused by
name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rcpflow.recipe import Hyperparameters
from rcpflow.records.manifest import ManifestRow

# The trainer flag that sets each of `RunIdentity.arguments`.
FLAGS: Mapping[str, str] = {
    "seed": "--seed",
    "global_batch_size": "--global-batch-size",
    "val_start_at": "--val-start-at",
    "max_steps": "--max-steps",
}


@dataclass(frozen=True)
class RunIdentity:
    seed: int
    global_batch_size: int
    val_start_at: int
    max_steps: int
    # The MLLOG's run_start; None where it is not known (rcp_logging off, or a checkpoint's
    # record, which holds only `arguments`).
    run_start_ms: int | None

    @classmethod
    def of_row(cls, row: ManifestRow, run_start_ms: int | None) -> RunIdentity:
        return cls(
            seed=row.seed,
            global_batch_size=row.global_batch_size,
            val_start_at=row.val_start_at,
            max_steps=row.max_steps,
            run_start_ms=run_start_ms,
        )

    @classmethod
    def of_run(cls, seed: int, hp: Hyperparameters, val_start_at: int) -> RunIdentity:
        """A trainer's own run as its checkpoints record it: the arguments, no run_start."""
        return cls(seed, hp.global_batch_size, val_start_at, hp.max_steps, run_start_ms=None)

    def arguments(self) -> dict[str, int]:
        """The values the trainer's flags set, as a checkpoint records them (JSON)."""
        return {name: getattr(self, name) for name in FLAGS}

    def differing_flags(self, recorded: object) -> str:
        """Each flag whose value differs from a checkpoint's `recorded` arguments, for a message."""
        if not isinstance(recorded, Mapping):
            return "no rcpflow run identity in the checkpoint"
        ours = self.arguments()
        return ", ".join(
            f"{flag} {ours[k]} vs the run's {recorded.get(k)}"
            for k, flag in FLAGS.items()
            if recorded.get(k) != ours[k]
        )
