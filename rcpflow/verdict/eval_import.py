"""Import another evaluator's result for one checkpoint into a run: ``eval/step_<n>/summary.json``.

A source (local or ``gs://``) is a summary (rcpflow's or Tunix's) or per-attempt records
(`rcpflow.records.attempts`); it must be about manifest row N's checkpoint and is verified as every
summary is. Anything not valid is refused naming the file, field or line, and nothing is
written; eval times are never invented; the MLLOG is never touched. `import_results_tree`
backfills a Tunix-style results tree (not to be confused with a trainer's checkpoint tree,
`rcpflow.trainer.nemo_rl_import`). Why: docs/design.md (verification of foreign inputs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any, Literal

from rcpflow import recipe
from rcpflow.files import jsonio
from rcpflow.files.layout import RunLayout, dirname, is_gcs, join
from rcpflow.files.storage import storage_for
from rcpflow.files.terminal_progress import Progress
from rcpflow.files.usererrors import refused_as
from rcpflow.records.attempts import AttemptFormat, AttemptsError, AttemptSet, parse_attempts
from rcpflow.records.decided import WrittenRunStop, written_run_stop
from rcpflow.records.manifest import ManifestError, ManifestRow, load
from rcpflow.records.mllog import MLLogError, read_events, read_given_log
from rcpflow.records.nemo_rl import (
    NemoRLError,
    foreign_run_stops,
    logged_eval,
    logged_eval_samples,
)
from rcpflow.records.summary import (
    TIME_FIELDS,
    EvalSummary,
    SummaryError,
    accuracy_only_summary,
    build_summary,
)
from rcpflow.records.summary_checks import Problem, recomputed_problems, validity_problems
from rcpflow.verdict.verify import ATTEMPTS_FILE, attempts_file

SourceFormat = Literal[
    "rcpflow-summary", "tunix-summary", "rcpflow-attempts", "deepswe", "r2egym", "nemo-rl-mllog"
]
SOURCE_FORMATS: tuple[SourceFormat, ...] = (
    "rcpflow-summary",
    "tunix-summary",
    "rcpflow-attempts",
    "deepswe",
    "r2egym",
    "nemo-rl-mllog",  # NeMo-RL's deferred evaluator's MLLOG: its accuracy only (never detected)
)
_ATTEMPT_FORMATS: dict[SourceFormat, AttemptFormat] = {
    "rcpflow-attempts": "rcpflow",
    "deepswe": "deepswe",
    "r2egym": "r2egym",
}
_SUMMARY_FORMATS: tuple[SourceFormat, ...] = ("rcpflow-summary", "tunix-summary")
_SUMMARY_KEYS = frozenset({"instances", "pass_at_k"})
_TREE_SUMMARY = re.compile(r"/step_([0-9]+)/([^/]+)/summary\.json")
# Tasks named when some have too few attempts; the rest are counted.
_NAMED_TASKS = 5


class EvalImportError(ValueError):
    """The source cannot be imported for that step; names the file, field or line."""


@dataclass(frozen=True)
class ImportResult:
    step: int
    source: str
    format: SourceFormat
    summary_path: str
    summary: EvalSummary
    attempts_source: str | None  # the attempts the summary was built from or checked against
    attempts_path: str | None  # where they were copied in the run
    times_from: Literal["source", "caller", "log"]
    not_counted: int  # infrastructure failures the evaluator retried: in no count
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        s = self.summary
        verdict = ">" if s.eval_accuracy > s.target_accuracy else "<="
        parts = [
            f"step {self.step}: imported {self.format} {self.source} -> {self.summary_path}",
            f"pass@{recipe.PASS_K} {s.eval_accuracy:.4f} ({verdict} target {s.target_accuracy})",
            f"{s.resolved_attempts}/{s.expected_attempts} attempts resolved",
            f"eval times from the {self.times_from}",
        ]
        if not s.attempt_records:
            parts[2] = (
                f"no per-attempt records (pass@{recipe.PASS_K} as logged, could not be recomputed)"
            )
        if self.not_counted:
            parts.append(f"{self.not_counted} retried infrastructure failures not counted")
        return ", ".join(parts + list(self.notes))


@dataclass(frozen=True)
class StepImport:
    """One step of a tree: what was imported, and every newer attempt that was rejected."""

    step: int
    imported: ImportResult | None
    rejected: tuple[tuple[str, str], ...]  # (source, why)

    def describe(self) -> str:
        lines = (
            [self.imported.describe()] if self.imported else [f"step {self.step}: nothing imported"]
        )
        lines += [f"step {self.step}: rejected: {why}" for _, why in self.rejected]
        return "\n".join(lines)


@dataclass(frozen=True)
class ResultsTreeImport:
    tree: str
    steps: tuple[StepImport, ...]
    skipped: tuple[str, ...] = ()  # what the walk did not follow, and why (symlinks out)

    @property
    def all_imported(self) -> bool:
        return all(s.imported is not None for s in self.steps)


def _read(path: str, what: str) -> bytes:
    try:
        return storage_for(path).read_bytes(path)
    except FileNotFoundError as e:
        raise EvalImportError(f"{path}: no such {what}") from e


def _read_text(path: str, what: str) -> str:
    with refused_as(EvalImportError, jsonio.JSONInputError):
        return jsonio.decode_utf8(_read(path, what), path)


def _row(run_dir: str, step: int) -> ManifestRow:
    with refused_as(EvalImportError, ManifestError):
        return load(RunLayout(run_dir).manifest).row(step)


def eval_times_from_log(log_path: str, row: ManifestRow) -> tuple[int, int]:
    """(start, stop) of the evaluation of `row`'s checkpoint as another pipeline logged it: the
    one ``eval_start`` and the one ``eval_stop`` whose metadata samples_count is the row's. None
    of either, or more than one (which one would it be?), is refused naming the log."""
    with refused_as(EvalImportError, MLLogError):
        events = read_given_log(log_path, "eval times")
    found = {}
    for key in ("eval_start", "eval_stop"):
        matching = [
            e
            for e in events
            if e.key == key and e.metadata.get("samples_count") == row.samples_count
        ]
        if len(matching) != 1:
            lines = ", ".join(str(e.line_no) for e in matching) or "none"
            raise EvalImportError(
                f"{log_path}: step {row.step}: {len(matching)} {key} events with samples_count "
                f"{row.samples_count} (lines: {lines}); exactly one gives the eval time"
            )
        found[key] = matching[0]
    start, stop = found["eval_start"], found["eval_stop"]
    if stop.time_ms < start.time_ms:
        raise EvalImportError(
            f"{log_path}: step {row.step}: eval_stop (line {stop.line_no}) {stop.time_ms} is "
            f"before eval_start (line {start.line_no}) {start.time_ms}"
        )
    return start.time_ms, stop.time_ms


def detect(text: str, where: str, fmt: SourceFormat | None = None) -> SourceFormat:
    """The format of a source: a JSON object with a summary's fields, else attempt records.
    Told an attempt format (`fmt`), records are read as that format only, so that an invalid one
    is named as a record of it."""
    try:
        whole = jsonio.loads(text, where, strict=False)  # strictness is for the import itself
    except jsonio.JSONInputError:
        whole = None
    if isinstance(whole, dict) and set(whole) >= _SUMMARY_KEYS:
        # Told apart for the report only: Tunix writes rcp_logged and no eval times.
        tunix = "rcp_logged" in whole or not any(k in whole for k in TIME_FIELDS)
        return "tunix-summary" if tunix else "rcpflow-summary"
    try:
        found = parse_attempts(text, where)
    except AttemptsError as e:
        if fmt in _ATTEMPT_FORMATS:  # named as a record of the format the caller says it is
            _parse_attempts(text, where, _ATTEMPT_FORMATS[fmt])
        raise EvalImportError(f"{where}: neither a summary nor attempt records ({e})") from e
    return {v: k for k, v in _ATTEMPT_FORMATS.items()}[found.format]


def _short_tasks(found: AttemptSet) -> list[Problem]:
    short = found.short_tasks
    missing_tasks = recipe.EVAL_SAMPLES - len(found.tasks)
    out = []
    if short:
        named = ", ".join(short[:_NAMED_TASKS]) + (", ..." if len(short) > _NAMED_TASKS else "")
        out.append(
            Problem(
                "attempts",
                f"{len(short)} task(s) with fewer than {recipe.EVAL_ATTEMPTS_PER_INSTANCE} "
                f"valid attempts: {named}",
            )
        )
    if missing_tasks:
        out.append(
            Problem(
                "attempts",
                f"{len(found.tasks)} of {recipe.EVAL_SAMPLES} tasks have records; "
                f"{missing_tasks} never ran",
            )
        )
    return out


def _parse_attempts(text: str, where: str, fmt: AttemptFormat | None) -> AttemptSet:
    with refused_as(EvalImportError, AttemptsError):
        return parse_attempts(text, where, fmt)


def import_eval(
    run_dir: str,
    step: int,
    source: str,
    *,
    eval_times: tuple[int, int] | None = None,
    fmt: SourceFormat | None = None,
    attempts: str | None = None,
    eval_times_from: str | None = None,
    reopen: bool = False,
) -> ImportResult:
    """Verify `source` as the evaluation of manifest row `step` and write it into `run_dir`.

    A step that a written ``run_stop`` depends on (any step up to it) is refused unless
    `reopen`: the next finalize then rewrites the eval section from the summaries.

    `attempts` names the records beside a summary source (default: its folder's
    ``attempts/attempts.jsonl`` when there is one). `eval_times_from` is an MLLOG to take the
    eval times from instead of `eval_times` (`eval_times_from_log`). Raises `EvalImportError`,
    writing nothing.
    """
    row = _row(run_dir, step)
    if fmt == "nemo-rl-mllog":
        if eval_times is not None or eval_times_from is not None or attempts is not None:
            raise EvalImportError(
                f"{source}: a nemo-rl-mllog carries its eval times and has no attempts: give "
                "neither"
            )
        return _import_nemo_rl(run_dir, row, source, reopen)
    if eval_times_from is not None:
        if eval_times is not None:
            raise EvalImportError("eval times: give them or a log to read them from, not both")
        eval_times = eval_times_from_log(eval_times_from, row)
    text = _read_text(source, "source")
    detected = detect(text, source, fmt)
    summary_source = detected in _SUMMARY_FORMATS
    # rcpflow's and Tunix's summaries differ only in the eval times: one reader for both.
    if fmt is not None and fmt != detected and not (summary_source and fmt in _SUMMARY_FORMATS):
        raise EvalImportError(f"{source}: --format {fmt} but the file is {detected}")
    if eval_times is not None:
        for name, value in zip(("start", "stop"), eval_times, strict=True):
            problem = recipe.time_problem(value)
            if problem is not None:
                raise EvalImportError(f"eval times: {name} {problem}")
        if eval_times[1] < eval_times[0]:
            raise EvalImportError(
                f"eval times: stop {eval_times[1]} is before start {eval_times[0]}"
            )
    reopened = _reopening(run_dir, row, reopen)
    layout = RunLayout(run_dir)
    notes: list[str] = []
    attempts_text: str | None = None
    not_counted = 0
    if summary_source:
        with refused_as(EvalImportError, jsonio.JSONInputError):
            d: Any = jsonio.loads(text, source)  # duplicate keys, NaN: not a summary to trust
        has_times = all(k in d for k in TIME_FIELDS)
        if eval_times is None and not has_times:
            raise EvalImportError(
                f"{source}: no eval_start_ms/eval_stop_ms (a {detected} carries no eval wall "
                "clock): give --eval-start-ms and --eval-stop-ms; a time is never invented"
            )
        if eval_times is not None and has_times:
            notes.append(f"the source's times {d['eval_start_ms']}..{d['eval_stop_ms']} replaced")
        with refused_as(EvalImportError, SummaryError):
            summary = EvalSummary.from_dict(d, source, eval_times)
        if attempts is None:
            beside = join(dirname(source), "attempts", ATTEMPTS_FILE)
            attempts = beside if storage_for(beside).exists(beside) else None
        problems = validity_problems(summary, row)
        if attempts is not None:
            attempts_text = _read_text(attempts, "attempts file")
            found = _parse_attempts(attempts_text, attempts, None)
            not_counted = found.not_counted
            problems += recomputed_problems(summary, found.per_instance(), attempts)
        times_from: Literal["source", "caller", "log"] = (
            "source" if eval_times is None else "log" if eval_times_from else "caller"
        )
    else:
        if attempts is not None:
            raise EvalImportError(f"{attempts}: a second attempts file for attempt records")
        if eval_times is None:
            raise EvalImportError(
                f"{source}: attempt records carry no eval wall clock: give --eval-start-ms and "
                "--eval-stop-ms; a time is never invented"
            )
        found = _parse_attempts(text, source, _ATTEMPT_FORMATS[detected])
        not_counted = found.not_counted
        summary = build_summary(
            found.per_instance(),
            checkpoint=row,
            target_accuracy=recipe.TARGET_ACCURACY,
            eval_start_ms=eval_times[0],
            eval_stop_ms=eval_times[1],
        )
        problems = _short_tasks(found) + validity_problems(summary, row)
        attempts, attempts_text = source, text
        times_from = "log" if eval_times_from else "caller"
    if problems:
        raise EvalImportError(
            f"{source}: not valid for step {step}: " + "; ".join(map(str, problems))
        )
    if eval_times_from is not None:
        notes.append(
            f"eval times {summary.eval_start_ms}..{summary.eval_stop_ms} from {eval_times_from}"
        )
    reached = summary.eval_accuracy > recipe.TARGET_ACCURACY  # valid: complete, no fatal error
    if reached != summary.target_reached:
        notes.append(f"target_reached {reached} (the source said {summary.target_reached})")
        summary = dataclasses.replace(summary, target_reached=reached)
    notes += reopened
    _check_reads_back(summary, source, layout.summary(step))
    copied = attempts_file(run_dir, step)
    path = layout.summary(step)
    _write_step(path, summary, copied, attempts_text)
    return ImportResult(
        step=step,
        source=source,
        format=fmt or detected,
        summary_path=path,
        summary=summary,
        attempts_source=attempts,
        attempts_path=copied if attempts_text is not None else None,
        times_from=times_from,
        not_counted=not_counted,
        notes=tuple(notes),
    )


def _import_nemo_rl(run_dir: str, row: ManifestRow, source: str, reopen: bool) -> ImportResult:
    """Row `row`'s accuracy from the log NeMo-RL's deferred evaluator wrote for its checkpoint
    (`rcpflow.records.nemo_rl.logged_eval`), with that log's eval times; the evaluator's own
    run_stop and anything else in it are ignored."""
    with refused_as(EvalImportError, NemoRLError, MLLogError):
        logged = logged_eval(source, row.samples_count, row.step)
        instances = logged.eval_samples
        if instances is None:  # a log of the evaluation only: the run's header says
            run_log = RunLayout(run_dir).mllog(row.seed)
            instances = logged_eval_samples(read_given_log(run_log, "the run's MLLOG"), run_log)
    if instances is None:
        raise EvalImportError(
            f"{source}: step {row.step}: no eval_samples in it or the run's MLLOG: how many "
            "instances were evaluated is not known"
        )
    summary = accuracy_only_summary(
        logged.accuracy,
        checkpoint=row,
        eval_start_ms=logged.eval_start_ms,
        eval_stop_ms=logged.eval_stop_ms,
        instances=instances,
    )
    problems = validity_problems(summary, row)
    if problems:
        raise EvalImportError(
            f"{source}: line {logged.accuracy_line}: not valid for step {row.step}: "
            + "; ".join(map(str, problems))
        )
    reopened = _reopening(run_dir, row, reopen)
    path = RunLayout(run_dir).summary(row.step)
    _check_reads_back(summary, source, path)
    _write_step(path, summary, attempts_file(run_dir, row.step), None)
    notes = [f"eval_accuracy line {logged.accuracy_line}; its other events ignored", *reopened]
    return ImportResult(
        step=row.step,
        source=source,
        format="nemo-rl-mllog",
        summary_path=path,
        summary=summary,
        attempts_source=None,
        attempts_path=None,
        times_from="log",
        not_counted=0,
        notes=tuple(notes),
    )


def _write_step(path: str, summary: EvalSummary, copied: str, attempts: str | None) -> None:
    """The step's attempts (`attempts`, or none: an earlier evaluation's are not these) and its
    summary written as one unit under the summary's lock, so that two imports of one step leave
    one source's pair, the later superseding the earlier whole. Attempts first: a crash between
    the two writes leaves a summary that disagrees with them (not valid, evaluated again), never
    an unchecked one. On gs:// the lock is the summary's generation precondition: a writer that
    loses it writes its attempts again before its summary; one that gives up (its retries spent)
    exits with an error and may leave its attempts beside the other's summary, which status then
    names invalid (the recount disagrees)."""

    def unit(_old: bytes | None) -> bytes:
        if attempts is not None:
            storage_for(copied).write_atomic(copied, attempts.encode())
        else:
            storage_for(copied).delete(copied)
        attempts_written(path)
        return summary.to_json().encode()

    storage_for(path).update(path, unit)


def attempts_written(summary_path: str) -> None:
    """The hook point between a step's two writes (its attempts written, its summary not yet):
    tests pause an import here to interleave another."""


def _reopening(run_dir: str, row: ManifestRow, reopen: bool) -> list[str]:
    """A decided run's summary of `row`'s step is replaced only with --reopen: then the note
    that says so (none when the run is not decided by it)."""
    decided = _decided_by(run_dir, row)
    if decided is None:
        return []
    with refused_as(EvalImportError, MLLogError):
        foreign = foreign_run_stops(read_events(decided.log_path))
    if any(f.line_no == decided.line_no for f in foreign):  # finalize refuses it, reopened or not
        (stop,) = [f for f in foreign if f.line_no == decided.line_no]
        raise EvalImportError(f"step {row.step}: {stop.refusal(decided.log_path, run_dir)}")
    if not reopen:
        raise EvalImportError(
            f"step {row.step}: the run is decided: {decided.describe()} depends on this step's "
            "summary; give --reopen to replace it (the next finalize then rewrites the eval "
            "section)"
        )
    return [f"reopened {decided.describe()}: the next finalize rewrites the eval section"]


def _decided_by(run_dir: str, row: ManifestRow) -> WrittenRunStop | None:
    """The written run_stop that depends on `row`'s summary, if any."""
    with refused_as(EvalImportError, MLLogError):
        written = written_run_stop(RunLayout(run_dir).mllog(row.seed), row)
    return written if written is not None and written.depends_on(row.step) else None


def _check_reads_back(summary: EvalSummary, source: str, path: str) -> None:
    """What is written must be what every reader reads: parse the bytes before writing them."""
    try:
        again = EvalSummary.from_json(summary.to_json(), path)
    except SummaryError as e:
        raise EvalImportError(f"{source}: its summary would not read back: {e}") from e
    if again != summary:
        raise EvalImportError(f"{source}: its summary would not read back as written")


def tree_summaries(tree: str) -> dict[int, list[str]]:
    """Summaries of a Tunix-style tree per step, newest attempt first (stamps sort by time)."""
    return _tree_summaries(tree)[0]


def results_tree_listing(tree: str) -> tuple[dict[int, list[str]], tuple[str, ...]]:
    """`tree_summaries` and what the walk skipped, each named with why (links out of the tree,
    dangling links, unlistable folders)."""
    return _tree_summaries(tree)


def _tree_summaries(tree: str) -> tuple[dict[int, list[str]], tuple[str, ...]]:
    root = tree.rstrip("/") if is_gcs(tree) else os.path.normpath(tree)
    paths, skipped = (storage_for(root).list(root), ()) if is_gcs(root) else _local_tree_files(root)
    found: dict[int, list[tuple[str, str]]] = {}
    for path in paths:
        m = _TREE_SUMMARY.fullmatch(path[len(root) :])
        if m is not None:
            found.setdefault(int(m.group(1)), []).append((m.group(2), path))
    summaries = {s: [p for _, p in sorted(v, reverse=True)] for s, v in sorted(found.items())}
    return summaries, skipped


def _local_tree_files(root: str) -> tuple[list[str], tuple[str, ...]]:
    """Files under `root`, following symlinked folders and files that stay inside the tree;
    the ones that lead out of it (or round in a loop), dangling links, a summary that is not a
    regular file, and folders that cannot be listed are skipped and named: never dropped
    silently."""
    real_root = os.path.realpath(root)
    files: list[str] = []
    skipped: list[str] = []

    def unlistable(e: OSError) -> None:
        if e.filename != root:  # the tree itself: the caller names it
            skipped.append(f"{e.filename}: cannot be listed ({e.strerror}): skipped")

    for dirpath, dirnames, filenames in os.walk(root, onerror=unlistable, followlinks=True):
        real = os.path.realpath(dirpath)
        # A link to a folder that holds it (an ancestor) would be walked for ever.
        loop = dirpath != root and _inside(os.path.realpath(os.path.dirname(dirpath)), real)
        if not _inside(real, real_root) or loop:
            why = "loops back to a folder above it" if loop else "leads out of the tree"
            skipped.append(f"{dirpath}: a symlink to {real} that {why}: skipped")
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in sorted(f for f in filenames if not f.startswith(".")):
            path = os.path.join(dirpath, name)
            target = os.path.realpath(path)
            if os.path.islink(path) and not os.path.exists(path):
                skipped.append(f"{path}: a symlink to {target} that does not exist: skipped")
            elif name == "summary.json" and not os.path.isfile(path):
                skipped.append(f"{path}: not a regular file: skipped")
            elif _inside(target, real_root):
                files.append(path)
            else:
                skipped.append(f"{path}: a symlink to {target} outside the tree: skipped")
    return sorted(files), tuple(skipped)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def import_results_tree(
    run_dir: str,
    tree: str,
    progress: Progress | None = None,
    *,
    eval_times_from: str | None = None,
    reopen: bool = False,
) -> ResultsTreeImport:
    """Per step of `tree`, import the newest attempt that is complete and valid (eval times from
    the source, else from the MLLOG `eval_times_from`)."""
    found, skipped = _tree_summaries(tree)
    if progress is not None:
        progress.total = len(found)
    steps = []
    for step, sources in found.items():
        if progress is not None:
            progress.advance(f"step {step}")
        rejected: list[tuple[str, str]] = []
        imported = None
        for source in sources:
            try:
                imported = import_eval(
                    run_dir, step, source, eval_times_from=eval_times_from, reopen=reopen
                )
                break
            except EvalImportError as e:
                rejected.append((source, str(e)))
        steps.append(StepImport(step=step, imported=imported, rejected=tuple(rejected)))
    return ResultsTreeImport(tree=tree, steps=tuple(steps), skipped=skipped)


# A foreign evaluate job's result: a file in one of SOURCE_FORMATS, or a Tunix-style tree of
# them (`tree_summaries`). The evaluate step of a DAG (tasks.jobs.result) and the Slurm batch
# script that evaluates in the training's allocation (`rcpflow eval start` / `eval import
# --since`) both take it in by this rule: what the job itself left, with the times around it.
RESULT_TREE = "tunix-tree"
RESULT_FORMATS: tuple[str, ...] = (*SOURCE_FORMATS, RESULT_TREE)


@dataclass(frozen=True)
class Baseline:
    """What was at a step's result path before its job started: the tree's attempts of that
    step (tunix-tree), or the file's sha256 (None: no file). Never imported: an old result
    cannot pass for this evaluation with times it was not evaluated in."""

    attempts: tuple[str, ...] = ()
    digest: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"attempts": list(self.attempts), "digest": self.digest}

    @classmethod
    def from_dict(cls, d: Any) -> Baseline:
        """The baseline `to_dict` wrote; EvalImportError on anything else."""
        ok = isinstance(d, dict) and set(d) == {"attempts", "digest"}
        attempts = d.get("attempts") if ok else None
        digest = d.get("digest") if ok else None
        if not (
            isinstance(attempts, list)
            and all(isinstance(a, str) for a in attempts)
            and (digest is None or isinstance(digest, str))
        ):
            raise EvalImportError(f"a result baseline must be {{attempts, digest}}, got {d!r}")
        return cls(attempts=tuple(attempts), digest=digest)


def _digest(path: str) -> str | None:
    storage = storage_for(path)
    if not storage.exists(path):
        return None
    return hashlib.sha256(storage.read_bytes(path)).hexdigest()


def result_baseline(fmt: str, path: str, step: int) -> Baseline:
    """What is at the result `path` (in `fmt`, one of RESULT_FORMATS) of `step` before its
    evaluate job runs."""
    if fmt == RESULT_TREE:
        return Baseline(attempts=tuple(tree_summaries(path).get(step, [])))
    return Baseline(digest=_digest(path))


def import_new_result(
    run_dir: str, step: int, fmt: str, path: str, before: Baseline, eval_times: tuple[int, int]
) -> ImportResult:
    """Import what the evaluate job of `step` left at `path` since `before`, with
    `eval_times`; EvalImportError (``step N: ...``, naming the path and why) when it left
    nothing new or nothing valid: nothing is written then."""
    if fmt == RESULT_TREE:
        new = [p for p in tree_summaries(path).get(step, []) if p not in before.attempts]
        if not new:
            raise EvalImportError(
                f"step {step}: the evaluate job left no new attempt under {path}/step_{step}/"
            )
        rejected = []
        for source in new:  # newest first
            try:
                return import_eval(run_dir, step, source, eval_times=eval_times)
            except EvalImportError as exc:
                rejected.append(str(exc))
        raise EvalImportError(f"step {step}: nothing the job left imports: {'; '.join(rejected)}")
    source_fmt = next((f for f in SOURCE_FORMATS if f == fmt), None)
    if source_fmt is None:
        raise EvalImportError(f"step {step}: {fmt!r} is none of {', '.join(RESULT_FORMATS)}")
    digest = _digest(path)
    if digest is None:
        raise EvalImportError(f"step {step}: the evaluate job left no result at {path}")
    if digest == before.digest:
        raise EvalImportError(
            f"step {step}: {path} is the same file as before the job ran: not this evaluation"
        )
    # NeMo-RL's evaluator logs its own eval_start/eval_stop around the evaluation: those.
    times = None if source_fmt == "nemo-rl-mllog" else eval_times
    try:
        return import_eval(run_dir, step, path, eval_times=times, fmt=source_fmt)
    except EvalImportError as exc:
        raise EvalImportError(f"step {step}: {exc}") from exc
