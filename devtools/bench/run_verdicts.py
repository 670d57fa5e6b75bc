"""A finished run's verdict read from its own files (manifest, persisted summaries), and the
benches' shared work folder and run timeout: what the time-to-verdict benches
(`verdict_bench`, `proportions_bench`, `slurm_bench`) measure a run by."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import NamedTuple

from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import ManifestRow, load
from rcpflow.records.summary import EvalSummary, read_summary
from tasks.deployment import REPO_ROOT

WORKDIR = REPO_ROOT / ".airflow" / "verdict_bench"
RUN_TIMEOUT_S = 40 * 60


def iso_ms(text: str) -> int:
    return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)


class RunVerdict(NamedTuple):
    """A finished run's manifest rows and persisted summaries, its first passing step, and when
    the summaries decided it (the latest eval_stop at or below that step)."""

    rows: tuple[ManifestRow, ...]
    summaries: dict[int, EvalSummary]
    step: int
    decided_ms: int


def run_verdict(run_dir: str) -> RunVerdict:
    layout = RunLayout(run_dir)
    rows = load(layout.manifest).rows
    summaries = {
        r.step: read_summary(layout.summary(r.step))
        for r in rows
        if Path(layout.summary(r.step)).exists()
    }
    passing = [s for s in sorted(summaries) if summaries[s].eval_accuracy > rows[0].target_accuracy]
    if not passing:
        raise RuntimeError(f"{run_dir}: no checkpoint passed; raise --max-steps")
    step = passing[0]
    if any(s not in summaries for s in range(rows[0].step, step)):
        raise RuntimeError(f"{run_dir}: a step below {step} was not evaluated")
    decided_ms = max(v.eval_stop_ms for s, v in summaries.items() if s <= step)
    return RunVerdict(rows, summaries, step, decided_ms)
