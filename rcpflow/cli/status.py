"""Where a run stands, for a submitter (`rcpflow status`) and a UI: per manifest row its
checkpoint, its summary (valid, pass@4, or why not), the gate's decision, what finalize would
write now, checkpoint folders without a row, and what `rcpflow retention apply` kept and deleted
and why (from its record, `rcpflow.retention.apply`). Reads only; the same checks as the
gate and finalize (`rcpflow.verdict.verify`), each summary read once (linear in the rows).

It degrades per step, never per run: a file of one step that cannot be read (an attempts path
that is a folder, a permission) shows that step as unreadable with why; a checkpoint on a
storage it cannot reach (``gs://`` without credentials while the run's own files are local)
shows that step's checkpoint as unknown with why. Only a manifest that cannot be used fails
the whole status (exit 1); everything else is the table with its reasons.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from rcpflow.files.layout import RunLayout, join, normalized
from rcpflow.files.storage import StorageError, storage_for
from rcpflow.files.usererrors import USER_ERRORS, describe
from rcpflow.records.decided import written_run_stop
from rcpflow.records.manifest import ManifestError, ManifestRow, load
from rcpflow.records.mllog import MLLogError
from rcpflow.retention.apply import RetentionNote, retention_notes
from rcpflow.trainer.recorder import checkpoint_present
from rcpflow.verdict.finalize import FinalizeInputError, Status, finalize
from rcpflow.verdict.gate import passes
from rcpflow.verdict.verify import StepEvaluation, SummaryState, evaluate_step, reading_once

UNRECORDED = "unrecorded (no timestamp; not evaluable)"
_STEP_FOLDER = re.compile(r"\d+")

GateDecision = Literal["evaluate", "passes", "below target", "skip"]


NOT_RECOMPUTED = (
    "pass@4 as the evaluator logged it: no per-attempt records, could not be recomputed"
)


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
    # why the checkpoint could not be looked at (then checkpoint_present is False: unknown)
    checkpoint_problem: str | None = None
    # False: the summary has no per-attempt records (NeMo-RL's logged accuracy): its pass@4
    # could not be recomputed.
    attempt_records: bool = True


@dataclass(frozen=True)
class FinalizeNow:
    """What `rcpflow finalize` would write if run now."""

    status: Status | Literal["refused"]
    run_stop_step: int | None
    reason: str
    # The log holds a run_stop (this one) and finalize would change the log: the verdict
    # written is rewritten by the next finalize (after `eval import --reopen`, say).
    rewrites: str | None = None


@dataclass(frozen=True)
class RunStatus:
    run_dir: str
    manifest_path: str
    manifest_error: str | None  # the manifest cannot be used: nothing else is known
    warnings: tuple[str, ...]
    steps: tuple[StepStatus, ...]
    finalize: FinalizeNow | None
    unrecorded: tuple[str, ...] = ()  # checkpoint folders with no manifest row
    # what `rcpflow retention apply` kept and deleted, and why (its record; no summary read)
    retention: tuple[RetentionNote, ...] = ()

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=2) + "\n"


def unrecorded_checkpoints(layout: RunLayout, rows: Sequence[ManifestRow]) -> tuple[str, ...]:
    """Step folders under ``checkpoints/`` (or one level down, as Tunix's ``actor/<N>``) that no
    row names: saved, but without a weight-update time they cannot be evaluated."""
    storage = storage_for(layout.checkpoints_dir)
    recorded = {normalized(r.checkpoint_path) for r in rows}
    found: list[str] = []
    for name in storage.subfolders(layout.checkpoints_dir):
        path = join(layout.checkpoints_dir, name)
        if _STEP_FOLDER.fullmatch(name):
            found.append(path)
        else:
            found += [
                join(path, sub) for sub in storage.subfolders(path) if _STEP_FOLDER.fullmatch(sub)
            ]
    return tuple(sorted((p for p in found if normalized(p) not in recorded), key=_step_key))


def _step_key(path: str) -> tuple[str, int]:
    head, _, step = path.rstrip("/").rpartition("/")
    return head, int(step)


def _unrecorded(layout: RunLayout, rows: Sequence[ManifestRow]) -> tuple[tuple[str, ...], str]:
    try:
        return unrecorded_checkpoints(layout, rows), ""
    except USER_ERRORS as e:
        return (), f"checkpoint folders not listed: {describe(e)}"


def run_status(run_dir: str) -> RunStatus:
    with reading_once():  # the gate, the verdict and each step share one read of each summary
        return _run_status(RunLayout(run_dir))


def _run_status(layout: RunLayout) -> RunStatus:
    try:
        manifest = load(layout.manifest)
    except ManifestError as e:
        unrecorded, problem = _unrecorded(layout, ())
        warnings: tuple[str, ...] = (problem,) if problem else ()
        return RunStatus(layout.root, layout.manifest, str(e), warnings, (), None, unrecorded)
    steps = []
    found_by_step: dict[int, StepEvaluation] = {}
    first_pass: int | None = None  # the lowest step whose valid summary passes
    for row in manifest.rows:
        try:
            found = evaluate_step(layout.root, row)
        except USER_ERRORS as e:  # one step's file, not the run: that step is unreadable
            found = StepEvaluation(
                row.step, layout.summary(row.step), "unreadable", None, (describe(e),)
            )
        found_by_step[row.step] = found
        passed_below = first_pass
        gate: GateDecision
        if passed_below is not None:
            gate = "skip"
        elif found.valid and found.summary is not None:
            gate = "passes" if passes(found.summary, row) else "below target"
        else:
            gate = "evaluate"
        if first_pass is None and gate == "passes":
            first_pass = row.step
        present, checkpoint_problem = _checkpoint(row.checkpoint_path)
        steps.append(
            StepStatus(
                step=row.step,
                timestamp_ms=row.timestamp_ms,
                samples_count=row.samples_count,
                checkpoint_path=row.checkpoint_path,
                checkpoint_present=present,
                checkpoint_problem=checkpoint_problem,
                summary=found.state,
                eval_accuracy=found.summary.eval_accuracy
                if found.valid and found.summary
                else None,
                problems=() if found.valid else found.problems,
                gate=gate,
                skipped_for=passed_below,
                attempt_records=found.summary is None or found.summary.attempt_records,
            )
        )
    now: FinalizeNow | None = None
    if manifest.rows:
        try:
            # finalize's own dry run: what it will do, refusals and the training section's
            # problems included, not only the verdict of the summaries
            result = finalize(layout.root, write=False, evaluations=found_by_step)
            rewrites = _rewrites(layout, manifest.rows) if result.log_changed else None
            now = FinalizeNow(result.status, result.step, result.reason, rewrites)
        except FinalizeInputError as e:
            now = FinalizeNow("refused", None, str(e))
        except USER_ERRORS as e:  # a file finalize would need cannot be read
            now = FinalizeNow("refused", None, describe(e))
    unrecorded, problem = _unrecorded(layout, manifest.rows)
    warnings = manifest.warnings + ((problem,) if problem else ())
    try:
        retention = tuple(retention_notes(layout.root))
    except USER_ERRORS as e:
        retention, warnings = (), (*warnings, f"retention record not read: {describe(e)}")
    return RunStatus(
        layout.root, layout.manifest, None, warnings, tuple(steps), now, unrecorded, retention
    )


def _checkpoint(path: str) -> tuple[bool, str | None]:
    """Whether the checkpoint is there, or why that cannot be told (its storage unreachable)."""
    try:
        return checkpoint_present(path), None
    except USER_ERRORS as e:
        return False, describe(e)


def _rewrites(layout: RunLayout, rows: Sequence[ManifestRow]) -> str | None:
    """The written run_stop (called when the next finalize would change the log holding it)."""
    try:
        written = written_run_stop(layout.mllog(rows[0].seed), rows[0])
        if written is None:
            return None
    except (FinalizeInputError, MLLogError, ValueError, OSError, StorageError):
        return None  # finalize itself will name the problem
    return written.describe()


def _retention_line(note: RetentionNote) -> str:
    what = f"step {note.step}" + (" train_state" if note.part == "train_state" else "")
    when = f", deleted {utc_text(note.when_ms)}" if note.when_ms is not None else ""
    return f"retention: {what} {note.state} ({note.reason}{when})"


def utc_text(time_ms: int) -> str:
    """Epoch milliseconds as ``2026-12-01 20:41:03.123 UTC`` (what `status` shows people)."""
    stamp = datetime.fromtimestamp(time_ms // 1000, tz=UTC)
    return stamp.strftime("%Y-%m-%d %H:%M:%S.") + f"{time_ms % 1000:03d} UTC"


def manifest_problem(status: RunStatus) -> str | None:
    """Why the run has no usable manifest, as one line naming the run folder; None if it has."""
    if status.manifest_error is None:
        return None
    return f"{status.run_dir}: no usable manifest: {status.manifest_error}"


def render_table(status: RunStatus) -> str:
    """The table `rcpflow status` prints (times in UTC; ``--json`` keeps the milliseconds).
    Without a usable manifest (`manifest_problem`), only the checkpoint folders found."""
    if status.manifest_error is not None:
        return "".join(f"{path}: {UNRECORDED}\n" for path in status.unrecorded) + "".join(
            f"warning: {w}\n" for w in status.warnings
        )
    head = ("step", "weight update (UTC)", "ckpt", "summary", "pass@4", "gate")
    rows = [head]
    notes = []
    for s in status.steps:
        acc = f"{s.eval_accuracy:.4f}" if s.eval_accuracy is not None else "-"
        gate = f"skip (step {s.skipped_for} passed)" if s.gate == "skip" else s.gate
        ckpt = "?" if s.checkpoint_problem else ("yes" if s.checkpoint_present else "NO")
        rows.append(
            (str(s.step), utc_text(s.timestamp_ms), ckpt, s.summary, acc, gate)
        )  # fmt: skip
        if s.summary in ("invalid", "unreadable"):
            notes.append(f"  step {s.step}: {'; '.join(s.problems)}")
        if s.checkpoint_problem:
            notes.append(f"  step {s.step}: checkpoint not looked at: {s.checkpoint_problem}")
        if not s.attempt_records:
            notes.append(f"  step {s.step}: {NOT_RECOMPUTED}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += notes
    lines += [f"{path}: {UNRECORDED}" for path in status.unrecorded]
    lines += [_retention_line(n) for n in status.retention]
    lines += [f"warning: {w}" for w in status.warnings]
    f = status.finalize
    if f is not None:
        stop = f", run_stop at step {f.run_stop_step}" if f.run_stop_step is not None else ""
        rewrites = (
            f"; the log's eval section is rewritten by the next finalize ({f.rewrites})"
            if f.rewrites is not None
            else ""
        )
        lines.append(f"finalize now: {f.status}{stop} ({f.reason}){rewrites}")
    return "\n".join(lines) + "\n"
