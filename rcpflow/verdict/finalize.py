"""Finalize: the single writer of the eval section of a run's MLLOG.

It keeps the training section byte for byte, drops whatever eval section an earlier finalize
wrote, walks the manifest rows by step and, for each row with a valid summary, appends
``eval_start``, ``tracked_stats``, ``eval_accuracy`` and ``eval_stop``. The first step strictly
above the target ends the run with ``run_stop status=success`` backdated to that checkpoint's
weight update; if every step up to ``max_steps`` was evaluated and none passed, ``aborted``.
Anything else is ``incomplete`` and gets no ``run_stop``: a terminal event is never fabricated.
Invalid input (a manifest or summary that cannot be read, a log that does not match) raises and
leaves the log untouched. The write is atomic; the same inputs always give the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from rcpflow.files import logtext
from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.files.usererrors import describe
from rcpflow.records.manifest import Manifest, ManifestError, ManifestRow, load
from rcpflow.records.mllog import EventRenderer, MLLogError, is_eval_section, parse
from rcpflow.records.nemo_rl import foreign_run_stops
from rcpflow.records.summary import EvalSummary
from rcpflow.records.training_section import describe as describe_section
from rcpflow.records.training_section import section_problems
from rcpflow.verdict.gate import passes
from rcpflow.verdict.verify import StepEvaluation, evaluate_step

Status = Literal["success", "aborted", "incomplete"]


class FinalizeInputError(ValueError):
    """The run's files cannot be finalized as they are; nothing was written."""


@dataclass(frozen=True)
class FinalizeResult:
    """What finalize decided (and wrote, unless asked not to): the run's status, the step and
    time of its run_stop when it succeeded, the steps it evaluated, and why."""

    status: Status
    log_path: str
    reason: str
    step: int | None = None
    samples_count: int | None = None
    time_ms: int | None = None
    evaluated_steps: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()
    log_changed: bool = False  # the log's bytes were (with write=False: would be) replaced

    def verdict(self) -> dict[str, object]:
        """The CLI's last line: status, plus step/samples_count/time_ms when the run ended."""
        d: dict[str, object] = {"status": self.status}
        if self.status != "incomplete":
            d.update(step=self.step, samples_count=self.samples_count, time_ms=self.time_ms)
        return d


def _is_eval_section_line(line: str) -> bool:
    if logtext.payload(line) is None:
        return False
    return is_eval_section(parse(line)[0])


def _training_section(text: str, log_path: str, run_dir: str = "RUN_DIR") -> str:
    """The log without any eval-section event; every other line kept byte for byte."""
    try:
        events = parse(text, where=log_path)
    except MLLogError as e:
        raise FinalizeInputError(str(e)) from e
    if not any(e.key == "run_start" for e in events):
        raise FinalizeInputError(f"{log_path}: no run_start (training never started?)")
    foreign = foreign_run_stops(events)
    if foreign:
        raise FinalizeInputError(foreign[0].refusal(log_path, run_dir))
    kept = [line for line in logtext.lines(text, keepends=True) if not _is_eval_section_line(line)]
    section = "".join(kept)
    return section if section.endswith("\n") or not section else section + "\n"


def _check_log_matches(training: str, manifest: Manifest, log_path: str) -> None:
    if not manifest.rows:
        return
    row = manifest.rows[0]
    events = {e.key: e for e in parse(training, where=log_path)}
    # Not `seed`: the row's is the run's seed index (the log's name, seed_<N>.out, which is how
    # the log was found); the seed the log states is the trainer's (NeMo-RL's launcher draws it).
    for key, want in (("global_batch_size", row.global_batch_size), ("max_steps", row.max_steps)):
        if key in events and events[key].value != want:
            raise FinalizeInputError(
                f"{log_path}: {key} {events[key].value!r} does not match the manifest's {want!r}"
            )


def eval_events(renderer: EventRenderer, summary: EvalSummary) -> list[str]:
    """The four MLLOG lines of one evaluated checkpoint, in the order the checker reads them."""
    step, samples = summary.checkpoint_step, summary.samples_count
    meta = {"step": step, "samples_count": samples}
    stop = summary.eval_stop_ms
    return [
        renderer.render("start", "eval_start", None, meta, summary.eval_start_ms),
        renderer.render(
            "event", "tracked_stats", {"validation_time": summary.validation_time_s},
            {"step": step}, stop,
        ),
        renderer.render("event", "eval_accuracy", summary.eval_accuracy, meta, stop),
        renderer.render("end", "eval_stop", None, meta, stop),
    ]  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    """What the eval section says, decided from the run's summaries."""

    status: Status
    reason: str
    end_row: ManifestRow | None  # the row run_stop is backdated to
    evaluated: tuple[EvalSummary, ...]  # valid summaries in step order, up to the decision


def decide(
    run_dir: str,
    rows: Sequence[ManifestRow],
    evaluations: Mapping[int, StepEvaluation] | None = None,
) -> Verdict:
    """Walk `rows` by step: the first valid summary above the target ends the run (success);
    all up to max_steps valid and none above: aborted; a missing or invalid one first:
    incomplete. An unreadable summary raises `FinalizeInputError`. `evaluations`: the steps
    already evaluated by the caller (status reads each summary once)."""
    evaluated: list[EvalSummary] = []
    for row in rows:
        given = evaluations.get(row.step) if evaluations is not None else None
        found = given if given is not None else evaluate_step(run_dir, row)
        if found.state == "missing":
            reason = f"step {row.step}: no eval summary at {found.summary_path}"
            return Verdict("incomplete", reason, None, tuple(evaluated))
        if found.state == "unreadable":
            raise FinalizeInputError(f"step {row.step}: {found.problems[0]}")
        if found.summary is None or not found.valid:
            reason = f"step {row.step}: summary not valid: {'; '.join(found.problems)}"
            return Verdict("incomplete", reason, None, tuple(evaluated))
        evaluated.append(found.summary)
        if passes(found.summary, row):
            reason = (
                f"step {row.step}: eval_accuracy {found.summary.eval_accuracy:.4f} > target "
                f"{row.target_accuracy}"
            )
            return Verdict("success", reason, row, tuple(evaluated))
    last = rows[-1]
    if last.step == last.max_steps:
        reason = f"all steps up to max_steps {last.max_steps} evaluated; none above target"
        return Verdict("aborted", reason, last, tuple(evaluated))
    reason = (
        f"step {last.step}: training stopped before max_steps {last.max_steps} and no "
        "checkpoint passed"
    )
    return Verdict("incomplete", reason, None, tuple(evaluated))


def finalize(
    run_dir: str,
    *,
    write: bool = True,
    evaluations: Mapping[int, StepEvaluation] | None = None,
) -> FinalizeResult:
    layout = RunLayout(run_dir)
    try:
        manifest = load(layout.manifest)
    except ManifestError as e:
        raise FinalizeInputError(str(e)) from e
    if not manifest.rows:
        raise FinalizeInputError(f"{layout.manifest}: no checkpoint rows to evaluate")
    # This run's own log (the manifest's rows were checked to name it), never another run's.
    log_path = layout.mllog(manifest.rows[0].seed)
    storage = storage_for(log_path)
    try:
        original_bytes = storage.read_bytes(log_path)
    except FileNotFoundError as e:
        raise FinalizeInputError(f"{log_path}: MLLOG not found (manifest's mllog_file)") from e
    except OSError as e:  # a folder where the log belongs, no permission
        raise FinalizeInputError(describe(e)) from e
    original = logtext.decode(original_bytes)  # as the checker reads it; every byte kept
    training = _training_section(original, log_path, layout.root)
    _check_log_matches(training, manifest, log_path)
    section = section_problems(parse(training, where=log_path), manifest.rows)

    verdict = decide(run_dir, manifest.rows, evaluations)
    status, end_row = verdict.status, verdict.end_row
    renderer = EventRenderer()
    lines: list[str] = []
    for summary in verdict.evaluated:
        lines += eval_events(renderer, summary)  # valid: its step and samples are the row's
    reason = verdict.reason
    if section:  # never a run_stop on a training section the checker must reject
        status, end_row, reason = "incomplete", None, describe_section(section)
    if end_row is not None:
        lines.append(
            renderer.render(
                "end",
                "run_stop",
                None,
                {"status": status, "samples_count": end_row.samples_count},
                end_row.timestamp_ms,
            )
        )
    new_bytes = logtext.encode(training + "".join(line + "\n" for line in lines))
    if write and new_bytes != original_bytes:

        def replace(current: bytes | None) -> bytes:
            # Conditional on the log being what we read: a concurrent writer makes us fail
            # loudly instead of dropping its lines. A concurrent finalize of the same inputs
            # wrote what we would write: no conflict.
            if current == new_bytes:
                return new_bytes
            if current != original_bytes:
                raise FinalizeInputError(f"{log_path}: changed while finalizing; run it again")
            return new_bytes

        storage.update(log_path, replace)
    return FinalizeResult(
        status=status,
        log_path=log_path,
        reason=reason,
        step=end_row.step if end_row else None,
        samples_count=end_row.samples_count if end_row else None,
        time_ms=end_row.timestamp_ms if end_row else None,
        evaluated_steps=tuple(s.checkpoint_step for s in verdict.evaluated),
        warnings=manifest.warnings,
        log_changed=new_bytes != original_bytes,
    )
