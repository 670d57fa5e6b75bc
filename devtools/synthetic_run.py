"""Build run folders with the rcpflow APIs, for tests that need a prepared run without training.

Everything goes through the real writers (TrainingLog, manifest.upsert, write_summary), so a
folder built here is what the trainer and evaluator would leave behind, with accuracies chosen
by the test.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import ManifestRow, load, upsert
from rcpflow.records.mllog import SystemInfo, TrainingLog
from rcpflow.records.summary import AttemptResult, build_summary, write_summary

T0 = 1_700_000_000_000  # a fixed epoch ms, so runs built twice are byte-identical
STEP_MS = 1_000


@dataclass(frozen=True)
class SyntheticRun:
    run_dir: str
    layout: RunLayout
    seed: int
    global_batch_size: int
    val_start_at: int
    max_steps: int
    division: str

    @property
    def log_file(self) -> Path:
        """The run's MLLOG (a local run)."""
        return Path(self.layout.mllog(self.seed))

    def row(self, step: int) -> ManifestRow:
        return ManifestRow(
            step=step,
            checkpoint_path=f"../checkpoints/{step}",
            timestamp_ms=T0 + 60_000 + step * STEP_MS,
            samples_count=step * self.global_batch_size,
            global_batch_size=self.global_batch_size,
            batch_size=self.global_batch_size // recipe.GENERATIONS_PER_PROMPT,
            num_generations=recipe.GENERATIONS_PER_PROMPT,
            val_start_at=self.val_start_at,
            max_steps=self.max_steps,
            target_accuracy=recipe.TARGET_ACCURACY,
            seed=self.seed,
            mllog_file=f"seed_{self.seed}.out",
        )


def attempts_for_accuracy(accuracy: float, attempts: int = 4) -> list[list[AttemptResult]]:
    """Per-instance attempts whose pass@4 is the smallest value >= `accuracy` on 251 instances."""
    n_pass = math.ceil(round(accuracy * recipe.EVAL_SAMPLES, 9))
    return [
        [AttemptResult("resolved", 1.0)] + [AttemptResult("failed")] * (attempts - 1)
        if i < n_pass
        else [AttemptResult("failed")] * attempts
        for i in range(recipe.EVAL_SAMPLES)
    ]


def write_eval(run: SyntheticRun, step: int, accuracy: float, **overrides: Any) -> None:
    evaluated(run.run_dir, run.row(step), accuracy, T0 + 3_600_000 + step * 10_000, **overrides)


def evaluated(
    run_dir: str, row: ManifestRow, accuracy: float, start_ms: int, **overrides: Any
) -> None:
    """The summary of `row`'s checkpoint with pass@4 `accuracy`, evaluated from `start_ms` for
    4.321 s; `overrides` go to `build_summary`."""
    summary = build_summary(
        attempts_for_accuracy(accuracy),
        checkpoint=row,
        target_accuracy=row.target_accuracy,
        eval_start_ms=start_ms,
        eval_stop_ms=start_ms + 4_321,
        **overrides,
    )
    write_summary(RunLayout(run_dir).summary(row.step), summary)


def make_run(
    run_dir: str,
    *,
    seed: int = 1,
    global_batch_size: int = 256,
    max_steps: int = 24,
    last_step: int | None = None,
    val_start_at: int | None = None,
    division: str = "closed",
    accuracies: Mapping[int, float] | None = None,
    stale_steps: Sequence[int] = (),
) -> SyntheticRun:
    """A trained run: MLLOG training section, manifest rows val_start..last_step, and
    summaries for the steps in `accuracies` (the step's pass@4)."""
    start_step = recipe.val_start_at(global_batch_size, val_start_at)
    run = SyntheticRun(
        run_dir, RunLayout(run_dir), seed, global_batch_size, start_step, max_steps, division
    )
    last = max_steps if last_step is None else last_step
    hp = recipe.hyperparameters(division, global_batch_size, max_steps)  # type: ignore[arg-type]
    log = TrainingLog(run.layout.mllog(seed))
    log.training_header(hp, seed, SystemInfo(), train_samples=4096, time_ms=T0)
    log.init_stop(T0 + 30_000)
    log.run_start(T0 + 60_000)
    log.block_start(0, 0, T0 + 60_000)
    log.block_stop(last * global_batch_size, last, T0 + 60_000 + last * STEP_MS)
    for step in range(start_step, last + 1):
        upsert(run.layout.manifest, run.row(step))
    for step in stale_steps:
        # an earlier attempt's row: older than run_start
        upsert(run.layout.manifest, ManifestRow(**{**run.row(step).__dict__, "timestamp_ms": T0}))
    for step, acc in (accuracies or {}).items():
        write_eval(run, step, acc)
    return run


def passing_run(tmp_path: Path, name: str = "run", **kw: Any) -> SyntheticRun:
    """`make_run` under `tmp_path/name` with step 18 below the target and step 19 above it."""
    kw.setdefault("accuracies", {18: 0.5, 19: 0.8})
    return make_run(str(tmp_path / name), **kw)


def rows_of(run_dir: str) -> list[ManifestRow]:
    """The run's current manifest rows, validated by `manifest.load` (stale rows dropped)."""
    return list(load(RunLayout(run_dir).manifest).rows)
