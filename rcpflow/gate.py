"""The short-circuit decision of deferred evaluation, taken from persisted summaries only.

Evaluation instances may run in any order (retries, speculative windows, `dag.test()`'s random
order), so "skip this checkpoint" is never inferred from which instance ran before: it is read
from the summaries on storage. A checkpoint can be skipped when a lower step's valid summary
already passes the target.
"""

from __future__ import annotations

from collections.abc import Sequence

from rcpflow.layout import RunLayout
from rcpflow.manifest import ManifestRow
from rcpflow.storage import storage_for
from rcpflow.summary import EvalSummary, SummaryError, read_summary, summary_problems


def valid_summary(run_dir: str, row: ManifestRow) -> EvalSummary | None:
    """The summary of `row`'s checkpoint if one exists and is valid for it (to reuse), else None."""
    path = RunLayout(run_dir).summary(row.step)
    if not storage_for(path).exists(path):
        return None
    try:
        summary = read_summary(path)
    except SummaryError:
        return None  # unreadable: evaluate again rather than trust it
    return None if summary_problems(summary, row) else summary


def passes(summary: EvalSummary, row: ManifestRow) -> bool:
    """Strictly above the target: the official checker's rule (0.69 itself fails)."""
    return summary.eval_accuracy > row.target_accuracy


def passing_step_below(run_dir: str, step: int, rows: Sequence[ManifestRow]) -> int | None:
    """The lowest step below `step` whose valid summary passes the target, if any."""
    for row in sorted(rows, key=lambda r: r.step):
        if row.step >= step:
            break
        summary = valid_summary(run_dir, row)
        if summary is not None and passes(summary, row):
            return row.step
    return None
