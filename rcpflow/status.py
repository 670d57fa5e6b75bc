"""Where a run stands, for a submitter (`rcpflow status`) and a UI: per manifest row its
checkpoint, its summary (valid, pass@4, or why not), the gate's decision, and what finalize would
write now. Reads only; the same checks as the gate and finalize (`rcpflow.verify`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Literal

from rcpflow.finalize import FinalizeInputError, Status, decide
from rcpflow.gate import passes, passing_step_below
from rcpflow.layout import RunLayout
from rcpflow.manifest import ManifestError, load
from rcpflow.recorder import checkpoint_present
from rcpflow.verify import SummaryState, evaluate_step

GateDecision = Literal["evaluate", "passes", "below target", "skip"]


@dataclass(frozen=True)
class StepStatus:
    step: int
    timestamp_ms: int
    samples_count: int
    checkpoint_path: str
    checkpoint_present: bool
    summary: SummaryState
    eval_accuracy: float | None  # pass@4 of a valid summary
    problems: tuple[str, ...]  # why the summary is not valid
    gate: GateDecision  # evaluate it, reuse it (passes / below target), or skip it
    skipped_for: int | None  # skip: the lower step that already passed


@dataclass(frozen=True)
class FinalizeNow:
    """What `rcpflow finalize` would write if run now."""

    status: Status | Literal["refused"]
    run_stop_step: int | None
    reason: str


@dataclass(frozen=True)
class RunStatus:
    run_dir: str
    manifest_path: str
    manifest_error: str | None  # the manifest cannot be used: nothing else is known
    warnings: tuple[str, ...]
    steps: tuple[StepStatus, ...]
    finalize: FinalizeNow | None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=2) + "\n"


def run_status(run_dir: str) -> RunStatus:
    layout = RunLayout(run_dir)
    try:
        manifest = load(layout.manifest)
    except ManifestError as e:
        return RunStatus(layout.root, layout.manifest, str(e), (), (), None)
    steps = []
    for row in manifest.rows:
        found = evaluate_step(layout.root, row)
        passed_below = passing_step_below(layout.root, row.step, manifest.rows)
        gate: GateDecision
        if passed_below is not None:
            gate = "skip"
        elif found.valid and found.summary is not None:
            gate = "passes" if passes(found.summary, row) else "below target"
        else:
            gate = "evaluate"
        steps.append(
            StepStatus(
                step=row.step,
                timestamp_ms=row.timestamp_ms,
                samples_count=row.samples_count,
                checkpoint_path=row.checkpoint_path,
                checkpoint_present=checkpoint_present(row.checkpoint_path),
                summary=found.state,
                eval_accuracy=found.summary.eval_accuracy
                if found.valid and found.summary
                else None,
                problems=() if found.valid else found.problems,
                gate=gate,
                skipped_for=passed_below,
            )
        )
    now: FinalizeNow | None = None
    if manifest.rows:
        try:
            verdict = decide(layout.root, manifest.rows)
            end = verdict.end_row.step if verdict.end_row is not None else None
            now = FinalizeNow(verdict.status, end, verdict.reason)
        except FinalizeInputError as e:
            now = FinalizeNow("refused", None, str(e))
    return RunStatus(layout.root, layout.manifest, None, manifest.warnings, tuple(steps), now)


def render_table(status: RunStatus) -> str:
    """The table `rcpflow status` prints."""
    if status.manifest_error is not None:
        return f"{status.run_dir}: no usable manifest: {status.manifest_error}\n"
    head = ("step", "timestamp_ms", "ckpt", "summary", "pass@4", "gate")
    rows = [head]
    notes = []
    for s in status.steps:
        acc = f"{s.eval_accuracy:.4f}" if s.eval_accuracy is not None else "-"
        gate = f"skip (step {s.skipped_for} passed)" if s.gate == "skip" else s.gate
        rows.append(
            (str(s.step), str(s.timestamp_ms), "yes" if s.checkpoint_present else "NO",
             s.summary, acc, gate)
        )  # fmt: skip
        if s.summary in ("invalid", "unreadable"):
            notes.append(f"  step {s.step}: {'; '.join(s.problems)}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += notes
    lines += [f"warning: {w}" for w in status.warnings]
    f = status.finalize
    if f is not None:
        stop = f", run_stop at step {f.run_stop_step}" if f.run_stop_step is not None else ""
        lines.append(f"finalize now: {f.status}{stop} ({f.reason})")
    return "\n".join(lines) + "\n"
