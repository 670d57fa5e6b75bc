"""Where training stands for one planned checkpoint, read from the run's files alone.

Evaluation during training waits for each planned step's checkpoint; the answer comes from
storage, the same on a laptop and on GKE: ``committed`` (the validated manifest has the step's
row), ``ended`` (the current attempt's MLLOG has its ``block_stop`` and the step has no row: it
never will) or ``pending``. A manifest or log that cannot be read is an error naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.records.manifest import ManifestError, ManifestRow, load
from rcpflow.records.mllog import MLLogError, read_events, run_start_ms

State = Literal["committed", "ended", "pending"]


class ProgressError(ValueError):
    """The run's manifest or MLLOG is unreadable or invalid; the message names it."""


@dataclass(frozen=True)
class CheckpointProgress:
    """Where one step's checkpoint stands: committed (its row), ended (training stopped before
    it), or pending; `detail` says why in a sentence."""

    step: int
    state: State
    row: ManifestRow | None  # when committed
    rows: tuple[ManifestRow, ...]  # the run's current rows, by step
    detail: str


def _block_stop_step(log_path: str) -> int | None:
    """The step of the current attempt's block_stop, if training has ended."""
    storage = storage_for(log_path)
    if not storage.exists(log_path):
        return None
    try:
        events = read_events(log_path)
    except FileNotFoundError:
        return None
    except MLLogError as exc:
        raise ProgressError(str(exc)) from exc
    start = run_start_ms(events)
    stops = [e for e in events if e.key == "block_stop" and (start is None or e.time_ms >= start)]
    if not stops:
        return None
    step = stops[-1].metadata.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise ProgressError(f"{log_path}: line {stops[-1].line_no}: block_stop has no step")
    return step


@dataclass(frozen=True)
class RunSnapshot:
    """One read of a run's manifest and MLLOG: answers for every planned step at once (the
    waits of a run share one read per poll instead of one each)."""

    rows: tuple[ManifestRow, ...]  # the run's current rows, by step
    ended_at: int | None  # the step of the current attempt's block_stop, once training ended

    def progress(self, step: int) -> CheckpointProgress:
        """Where training stands for `step`."""
        rows = self.rows
        last = rows[-1].step if rows else None
        for row in rows:
            if row.step == step:
                return CheckpointProgress(step, "committed", row, rows, f"step {step} committed")
        if self.ended_at is not None:
            newest = "no checkpoint row" if last is None else f"the last row is step {last}"
            detail = (
                f"training ended (block_stop at step {self.ended_at}) without step {step}: {newest}"
            )
            return CheckpointProgress(step, "ended", None, rows, detail)
        waiting = "no row yet" if last is None else f"newest row step {last}"
        return CheckpointProgress(step, "pending", None, rows, f"step {step}: waiting ({waiting})")


def run_snapshot(run_dir: str, seed: int) -> RunSnapshot:
    """Read the manifest, then the MLLOG of the run of `seed` in `run_dir` (in that order: a
    row written before block_stop is never missed by a reader that sees block_stop)."""
    layout = RunLayout(run_dir)
    rows: tuple[ManifestRow, ...] = ()
    if storage_for(layout.manifest).exists(layout.manifest):
        try:
            rows = load(layout.manifest, layout.mllog(seed)).rows
        except ManifestError as exc:
            raise ProgressError(f"manifest: {exc}") from exc
    return RunSnapshot(rows, _block_stop_step(layout.mllog(seed)))
