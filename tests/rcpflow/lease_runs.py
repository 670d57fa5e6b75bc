"""A trainer's recorder on a run folder, for the tests of the run folder's lease
(rcpflow/trainer/test_lease_*.py, test_run_ownership.py): the closed recipe at global batch size
256, 20 steps, validation from step 18; a checkpoint is any folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rcpflow import recipe
from rcpflow.trainer.recorder import TrainingRecorder

GBS, MAX_STEPS, VAL_START = 256, 20, 18
T0 = 1_700_000_000_000


def recorder(run_dir: str, owner: str | None = None, **kw: Any) -> TrainingRecorder:
    hp = recipe.hyperparameters("closed", GBS, MAX_STEPS)
    return TrainingRecorder(
        run_dir, seed=1, hyperparameters=hp, val_start_at=VAL_START, owner=owner, **kw
    )


def checkpoint(run_dir: str, step: int) -> str:
    path = Path(run_dir) / "checkpoints" / str(step)
    path.mkdir(parents=True, exist_ok=True)
    (path / "w").write_bytes(b"w")
    return str(path)
