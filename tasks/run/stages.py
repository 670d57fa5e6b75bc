"""The steps of a run around its jobs, as plain functions every backend's tasks call: the
checks after training, the steps before and after an evaluation job, ``finalize`` and the
compliance checker. (The pure decision whether a step is needed is `rcpflow.verdict.gate`'s.)

Evaluation instances run in any order, so whether a step is evaluated is decided from the
summaries on storage alone (`skip_if_decided`, `reusable`); once a step passes, the
evaluations of higher steps still running are stopped (`cancel_above`), and never one below.
A skip's reason is the first line the instance logs. An aborted run is said in so many words
(`aborted_words`). Where each step runs in a run folder's life: docs/run-folder.md.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from airflow.sdk.exceptions import AirflowSkipException

from rcpflow.files.layout import RunLayout
from rcpflow.records.decided import logged_run_stop
from rcpflow.records.manifest import ManifestError, ManifestRow, load
from rcpflow.records.mllog import is_eval_section, read_events, run_start_ms
from rcpflow.records.nemo_rl import NemoRLError
from rcpflow.submission.checkers import compliance
from rcpflow.verdict.finalize import FinalizeInputError, finalize
from rcpflow.verdict.gate import lowest_passing, passes, valid_summary
from rcpflow.verdict.readiness import skip_sentence
from rcpflow.verdict.stop_request import honoured_by
from rcpflow.verdict.verify import evaluate_step
from tasks.deployment import load_deployment
from tasks.jobs.result import EvaluationError
from tasks.results.verdicts import record, tool_log_dir
from tasks.run.spec import RunSpec
from tasks.run.train_result import import_checkpoints

log = logging.getLogger(__name__)


class TrainingOutputError(RuntimeError):
    """The training job exited 0 but its outputs are not a usable run; names what is wrong."""


def check_training_outputs(spec: RunSpec) -> dict[str, Any]:
    """The manifest is valid and covers val_start_at..max_steps (or up to where a stop request
    of this run ended training); the MLLOG is a training section."""
    layout = RunLayout(spec.run_dir)
    try:  # a trainer whose checkpoints rcpflow records: its tree, imported (the same: no write)
        import_checkpoints(
            spec.run_dir,
            spec.seed,
            load_deployment().jobs.train.result,
            spec.effective_val_start_at,
            allow_empty=False,
        )
    except NemoRLError as exc:
        raise TrainingOutputError(f"checkpoint import: {exc}") from exc
    try:
        manifest = load(layout.manifest)
    except ManifestError as exc:
        raise TrainingOutputError(f"manifest: {exc}") from exc
    for warning in manifest.warnings:
        log.warning("manifest: %s", warning)
    if not manifest.rows:
        raise TrainingOutputError(f"{layout.manifest}: no checkpoint rows after training")
    first, last = manifest.rows[0], manifest.rows[-1]
    expected = {
        "seed": spec.seed,
        "global_batch_size": spec.global_batch_size,
        "max_steps": spec.max_steps,
        "val_start_at": spec.effective_val_start_at,
    }
    for name, value in expected.items():
        if getattr(first, name) != value:
            raise TrainingOutputError(
                f"{layout.manifest}: step {first.step}: {name} is {getattr(first, name)!r}, "
                f"the run asked for {value!r}"
            )
    if last.step != spec.max_steps:
        # Evaluation during training may have asked the trainer to stop at the verdict.
        stop = honoured_by(spec.run_dir, manifest.rows)
        if stop is None:
            raise TrainingOutputError(
                f"{layout.manifest}: last checkpoint is step {last.step}, training should have "
                f"saved every step up to max_steps {spec.max_steps}"
            )
        log.info("training stopped at step %d on request: %s", last.step, stop.reason)
    log_path = layout.mllog(spec.seed)
    if first.mllog_file != log_path:
        raise TrainingOutputError(
            f"{layout.manifest}: rows name MLLOG {first.mllog_file}, expected {log_path}"
        )
    try:
        events = read_events(log_path)
    except FileNotFoundError as exc:
        raise TrainingOutputError(f"{log_path}: no MLLOG after training") from exc
    if run_start_ms(events) is None:
        raise TrainingOutputError(f"{log_path}: no run_start")
    eval_keys = sorted({e.key for e in events if is_eval_section(e)})
    if eval_keys:
        # finalize writes these after evaluation; a fresh training log must not have them
        raise TrainingOutputError(f"{log_path}: training log already has {', '.join(eval_keys)}")
    log.info(
        "training outputs ok: %d checkpoints, steps %d..%d, MLLOG %s",
        len(manifest.rows),
        first.step,
        last.step,
        log_path,
    )
    return {"checkpoints": len(manifest.rows), "first_step": first.step, "last_step": last.step}


def load_rows(run_dir: str) -> list[dict[str, Any]]:
    """The manifest's rows (validated, stale ones dropped) as JSON-able dicts, by step."""

    manifest = load(RunLayout(run_dir).manifest)
    for warning in manifest.warnings:
        log.warning("manifest: %s", warning)
    if not manifest.rows:
        raise EvaluationError(f"{manifest.path}: no checkpoint rows to evaluate")
    log.info(
        "%d checkpoints to consider: steps %d..%d",
        len(manifest.rows),
        manifest.rows[0].step,
        manifest.rows[-1].step,
    )
    return [dataclasses.asdict(r) for r in manifest.rows]


def finalize_run(run_dir: str) -> dict[str, Any]:
    """`rcpflow.verdict.finalize`, refusing to end green without a run_stop."""

    try:
        result = finalize(run_dir)
    except FinalizeInputError as exc:
        raise EvaluationError(f"finalize refused {run_dir} (log untouched): {exc}") from exc
    for warning in result.warnings:
        log.warning("finalize: %s", warning)
    if result.status == "incomplete":
        raise EvaluationError(
            f"run {run_dir} is incomplete, no run_stop was written: {result.reason}"
        )
    if result.status == "aborted":
        log.warning("%s", aborted_words(result.step))
    log.info("finalize: %s (%s); MLLOG %s", result.status, result.reason, result.log_path)
    return {**result.verdict(), "reason": result.reason, "log_path": result.log_path}


def aborted_words(step: int | None) -> str:
    """What an aborted run is, in the words the report and the task log use."""
    return f"aborted: no checkpoint reached the target by step {step}"


def aborted_step(row: ManifestRow) -> int | None:
    """The step of the run_stop status=aborted in `row`'s MLLOG, if the run was aborted."""
    stop = logged_run_stop(read_events(row.mllog_file), row.global_batch_size)
    return stop.step if stop is not None and stop.status == "aborted" else None


def log_division(log_path: str) -> str:
    """The division the MLLOG declares (what the trainer was asked to run)."""

    declared = [e.value for e in read_events(log_path) if e.key == "submission_division"]
    if len(declared) != 1:
        raise EvaluationError(
            f"{log_path}: expected one submission_division event, found {len(declared)}"
        )
    return str(declared[0])


def check_run(run_dir: str) -> dict[str, Any]:
    """The official compliance checker on the run's MLLOG, for the division it declares."""

    layout = RunLayout(run_dir)
    first = load(layout.manifest).rows[0]
    log_path = first.mllog_file
    aborted = aborted_step(first)
    if aborted is not None:  # first, before the checker's own words
        log.warning("%s", aborted_words(aborted))
    division = log_division(log_path)
    result = compliance(log_path, division=division, log_dir=tool_log_dir(layout.root))
    verdict = record(result, subject=log_path, folder=layout.root)
    for line in result.output.splitlines()[-20:]:
        log.info("compliance_checker | %s", line)
    if not verdict.ok:
        headline = "" if aborted is None else f"{aborted_words(aborted)}; "
        raise EvaluationError(
            f"{headline}compliance checker ({division}) rejects {log_path}:\n  "
            + "\n  ".join(verdict.errors)
        )
    log.info("compliance checker (%s division): %s passes", division, log_path)
    return {"division": division, "log_path": log_path, "ok": True}


@dataclass(frozen=True)
class EvalTarget:
    """One checkpoint to evaluate, with the run's current manifest rows (for the gate)."""

    run_dir: str
    row: ManifestRow
    rows: tuple[ManifestRow, ...]

    @property
    def step(self) -> int:
        return self.row.step


def eval_target(run_dir: str, row: dict[str, Any]) -> EvalTarget:
    """Re-read the manifest rather than trust the XCom copy: the gate must see the run as it
    is now, and a row that changed since load_manifest is an error, not something to guess."""

    step = row["step"]
    manifest = load(RunLayout(run_dir).manifest)
    try:
        current = manifest.row(step)
    except ManifestError as exc:
        raise EvaluationError(f"step {step}: no longer in the manifest: {exc}") from exc
    if dataclasses.asdict(current) != row:
        raise EvaluationError(f"step {step}: manifest row changed since load_manifest; re-run")
    return EvalTarget(run_dir=run_dir, row=current, rows=manifest.rows)


def step_target(run_dir: str, step: int) -> EvalTarget:
    """The checkpoint of `step` as the manifest has it now (evaluation during training: the
    step's wait saw its row committed)."""
    manifest = load(RunLayout(run_dir).manifest)
    try:
        current = manifest.row(step)
    except ManifestError as exc:
        raise EvaluationError(f"step {step}: not in the manifest: {exc}") from exc
    return EvalTarget(run_dir=run_dir, row=current, rows=manifest.rows)


def skip_if_decided(target: EvalTarget, *, stopped: bool = False) -> None:
    """AirflowSkipException when a lower step's valid summary already passes the target; its
    message names the step that decided the run and is logged first (the task runner logs an
    exception's message only under "Post Execute"). `stopped`: the step's job was running
    and was stopped (or failed) after that pass."""

    passed = lowest_passing(target.run_dir, target.rows, below=target.step)
    if passed is not None:
        reason = skip_sentence(
            target.step,
            "decided",
            passed=passed,
            target_accuracy=target.row.target_accuracy,
            stopped=stopped,
        )
        log.info("%s", reason)
        raise AirflowSkipException(reason)


def reusable(target: EvalTarget) -> bool:

    if valid_summary(target.run_dir, target.row) is None:
        return False
    log.info(
        "step %d: reusing the valid summary at %s",
        target.step,
        RunLayout(target.run_dir).summary(target.step),
    )
    return True


def collect(target: EvalTarget) -> dict[str, Any]:
    """Read and validate the step's summary (the instances of later steps then skip
    themselves, see `skip_if_decided`)."""

    step = target.step
    found = evaluate_step(target.run_dir, target.row)
    if found.state == "missing":
        raise EvaluationError(f"step {step}: the job wrote no summary at {found.summary_path}")
    if found.summary is None or not found.valid:
        raise EvaluationError(
            f"step {step}: summary {found.summary_path} is {found.state}: "
            + "; ".join(found.problems)
        )
    summary = found.summary
    reached = passes(summary, target.row)
    log.info(
        "step %d: eval_accuracy (pass@4) %.4f %s target %s",
        step,
        summary.eval_accuracy,
        ">" if reached else "<=",
        target.row.target_accuracy,
    )
    later = [r.step for r in target.rows if r.step > step]
    if reached and later:
        log.info(
            "step %d passed: the evaluations of steps %d..%d are not needed",
            step,
            later[0],
            later[-1],
        )
    return {"step": step, "eval_accuracy": summary.eval_accuracy, "target_reached": reached}


Cancel = Callable[[str, int], bool]


def cancel_above(
    run_dir: str, step: int, cancel: Cancel, steps: Iterable[int] | None = None
) -> list[int]:
    """Stop the evaluation jobs of the steps above `step` (its summary passed): each through
    `cancel(run_dir, step)`, which says whether one was running. `steps`: the candidates
    (default: the manifest's rows). Never a step at or below `step`. Returns those stopped."""
    if steps is None:
        steps = [r.step for r in load(RunLayout(run_dir).manifest).rows]
    stopped = [s for s in sorted(set(steps)) if s > step and cancel(run_dir, s)]
    if stopped:
        log.info(
            "step %d passed: stopped the evaluation(s) of step(s) %s, now useless",
            step,
            ", ".join(map(str, stopped)),
        )
    return stopped
