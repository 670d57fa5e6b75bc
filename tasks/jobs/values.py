"""What the placeholders of a job command (`tasks.jobs.command`) stand for, for one run or one
checkpoint: the same values on every backend; only ``{python}`` is the backend's (the worker's
interpreter locally, the image's ``python`` on GKE)."""

from __future__ import annotations

from collections.abc import Mapping

from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import ManifestRow

Values = dict[str, str | int]


def train_values(run: Mapping[str, str | int], python: str) -> Values:
    """The training job's values (`PLACEHOLDERS["train"]`) from the run's own (its RunSpec's
    ``job_values()``: run_dir, seed, batch size, steps, division)."""
    layout = RunLayout(str(run["run_dir"]))
    return {"python": python, **run, "checkpoint_dir": layout.checkpoints_dir}


def evaluate_values(run_dir: str, row: ManifestRow, python: str) -> Values:
    """The evaluate job's values for the checkpoint of `row` (a loaded row: its
    checkpoint_path is absolute)."""
    layout = RunLayout(run_dir)
    return {
        "python": python,
        "run_dir": layout.root,
        "step": row.step,
        "seed": row.seed,
        "samples_count": row.samples_count,
        "checkpoint_path": row.checkpoint_path,
        "checkpoint_timestamp_ms": row.timestamp_ms,
        "summary_dir": layout.eval_dir(row.step),
    }
