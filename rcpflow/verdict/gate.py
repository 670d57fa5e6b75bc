"""The short-circuit decision of deferred evaluation, taken from persisted summaries only.

A checkpoint can be skipped when a lower step's valid summary already passes the target
(strictly above it); never inferred from which evaluation ran first (docs/design.md, the gate).
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

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


def lowest_passing(
    run_dir: str,
    rows: Sequence[ManifestRow],
    *,
    below: int | None = None,
    known: MutableMapping[tuple[str, int, int], bool] | None = None,
) -> int | None:
    """The lowest step of `rows` (below `below`, when given) whose valid summary passes the
    target, if any. `known` keeps the verdicts found (run_dir, step, weight-update time ->
    passes): a valid summary is reused, never evaluated again, so its verdict never changes."""
    for row in sorted(rows, key=lambda r: r.step):
        if below is not None and row.step >= below:
            break
        key = (run_dir, row.step, row.timestamp_ms)
        verdict = None if known is None else known.get(key)
        if verdict is None:
            summary = valid_summary(run_dir, row)
            if summary is None:
                continue
            verdict = passes(summary, row)
            if known is not None:
                known[key] = verdict
        if verdict:
            return row.step
    return None
