"""TEMPORARY stand-in for ``rcpflow.status`` (being written on another branch): where one run
stands, per manifest row, read from storage with rcpflow's own readers.

The RCP view and the convergence plot read a run only through `run_status`; when
``rcpflow.status`` lands this module is deleted and they call it instead. Nothing here decides
anything rcpflow does not: validity is `rcpflow.summary.summary_problems`, passing is
`rcpflow.gate.passes`, the run's end is what the MLLOG's ``run_stop`` says.
"""

from __future__ import annotations

from dataclasses import dataclass

from rcpflow.gate import passes
from rcpflow.layout import RunLayout
from rcpflow.manifest import ManifestError, load
from rcpflow.mllog import MLLogError, read_events
from rcpflow.storage import storage_for
from rcpflow.summary import SummaryError, read_summary, summary_problems


@dataclass(frozen=True)
class StepStatus:
    step: int
    timestamp_ms: int  # the weight update this checkpoint holds
    samples_count: int
    checkpoint_path: str
    checkpoint_present: bool
    summary_path: str
    evaluation: str  # "valid" | "invalid" | "not evaluated"
    pass_at_4: float | None  # of a valid summary only
    problem: str | None  # why the summary is not valid
    gate: str  # what the eval gate does with this step: "evaluate" | "reuse" | "skip"
    decided_by: int | None  # for "skip": the lower step that passed
    passed: bool


@dataclass(frozen=True)
class RunStop:
    status: str
    time_ms: int
    samples_count: int
    step: int


@dataclass(frozen=True)
class RunStatus:
    run_dir: str
    seed: int | None
    global_batch_size: int | None
    max_steps: int | None
    val_start_at: int | None
    target_accuracy: float | None
    mllog_path: str | None
    manifest_path: str
    manifest_error: str | None
    rows: tuple[StepStatus, ...]
    passing_step: int | None  # lowest step whose valid summary passes
    run_stop: RunStop | None  # what finalize wrote into the MLLOG, if it did


def _present(path: str) -> bool:
    storage = storage_for(path)
    return storage.exists(path) or bool(storage.list(path))


def run_status(run_dir: str) -> RunStatus:
    layout = RunLayout(run_dir)
    try:
        manifest = load(layout.manifest)
    except ManifestError as exc:
        return RunStatus(
            layout.root, None, None, None, None, None, None, layout.manifest, str(exc), (), None,
            None,
        )  # fmt: skip
    rows: list[StepStatus] = []
    passing: int | None = None
    for row in manifest.rows:
        path = layout.summary(row.step)
        evaluation, accuracy, problem, ok = "not evaluated", None, None, False
        if storage_for(path).exists(path):
            try:
                summary = read_summary(path)
                problems = summary_problems(summary, row)
            except SummaryError as exc:
                problems = [str(exc)]
            if problems:
                evaluation, problem = "invalid", "; ".join(problems)
            else:
                evaluation, accuracy, ok = "valid", summary.eval_accuracy, passes(summary, row)
        if passing is not None and row.step > passing:
            gate, decided_by = "skip", passing
        else:
            gate, decided_by = ("reuse" if evaluation == "valid" else "evaluate"), None
        rows.append(
            StepStatus(
                step=row.step,
                timestamp_ms=row.timestamp_ms,
                samples_count=row.samples_count,
                checkpoint_path=row.checkpoint_path,
                checkpoint_present=_present(row.checkpoint_path),
                summary_path=path,
                evaluation=evaluation,
                pass_at_4=accuracy,
                problem=problem,
                gate=gate,
                decided_by=decided_by,
                passed=ok,
            )
        )
        if ok and passing is None:
            passing = row.step
    first = manifest.rows[0] if manifest.rows else None
    log_path = first.mllog_file if first else None
    return RunStatus(
        run_dir=layout.root,
        seed=first.seed if first else None,
        global_batch_size=first.global_batch_size if first else None,
        max_steps=first.max_steps if first else None,
        val_start_at=first.val_start_at if first else None,
        target_accuracy=first.target_accuracy if first else None,
        mllog_path=log_path,
        manifest_path=layout.manifest,
        manifest_error=None,
        rows=tuple(rows),
        passing_step=passing,
        run_stop=_run_stop(log_path, first.global_batch_size) if first and log_path else None,
    )


def _run_stop(log_path: str, global_batch_size: int) -> RunStop | None:
    try:
        events = read_events(log_path)
    except (FileNotFoundError, MLLogError):
        return None
    stops = [e for e in events if e.key == "run_stop"]
    if not stops:
        return None
    stop = stops[-1]
    samples = int(stop.metadata["samples_count"])
    status = str(stop.metadata["status"])
    return RunStop(status, stop.time_ms, samples, samples // global_batch_size)
