"""The short-circuit decision of deferred evaluation, taken from persisted summaries only.

A checkpoint can be skipped when a lower step's valid summary already passes the target
(strictly above it); never inferred from which evaluation ran first (docs/design.md, the gate).
"""

from __future__ import annotations

from collections.abc import Sequence

from rcpflow import recipe
from rcpflow.records.manifest import ManifestRow
from rcpflow.records.summary import EvalSummary
from rcpflow.verdict.verify import evaluate_step


def valid_summary(run_dir: str, row: ManifestRow) -> EvalSummary | None:
    """The summary of `row`'s checkpoint if one exists and is valid for it (to reuse), else None:
    an unreadable or invalid one is evaluated again rather than trusted."""
    found = evaluate_step(run_dir, row)
    return found.summary if found.valid else None


def passes(summary: EvalSummary, row: ManifestRow) -> bool:
    """Strictly above the rules' target: the official checker's rule (0.69 itself fails). The
    target is the recipe's, whatever a row or a summary states (they are refused elsewhere)."""
    return summary.eval_accuracy > recipe.TARGET_ACCURACY


def passing_step_below(run_dir: str, step: int, rows: Sequence[ManifestRow]) -> int | None:
    """The lowest step below `step` whose valid summary passes the target, if any."""
    for row in sorted(rows, key=lambda r: r.step):
        if row.step >= step:
            break
        summary = valid_summary(run_dir, row)
        if summary is not None and passes(summary, row):
            return row.step
    return None
