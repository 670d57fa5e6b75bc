"""What lies under a storage root: the submissions, the standalone runs, every persisted verdict.

A submission is a folder ``<root>/<name>/`` with ``runs/seed_<s>/`` (see `tasks.submission.spec`)
that the submission DAG made: its ``checks/``, ``submission/`` or report are there, or Airflow
knows a submission DAG run of that name (`index`'s `submission_runs`); its checker verdicts are
the ``checks/<tool>.json`` files the check tasks wrote. Any other run folder (one with
``mllog/``) up to `RUN_DEPTH` folders below the root is a standalone run. A run is what
`rcpflow.cli.status` says of it (per step: checkpoint, summary, gate; what finalize would write),
with the settings its manifest rows carry, what its MLLOG holds (``run_start``, ``run_stop``,
tracked training stats) and its compliance verdict.

Everything is read with rcpflow's readers and `tasks.results.verdicts`, nothing is decided here. A
file that cannot be read (malformed, truncated, out of range, storage without credentials) becomes a
named problem of its run or submission, never an exception; a folder whose name cannot be
served (`SAFE_NAME`) is listed as skipped. Paths handed in from outside (a URL) are resolved
with `resolve_under`, which refuses anything not below the root, symlinks resolved first.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from rcpflow import recipe
from rcpflow.cli.status import RunStatus, run_status
from rcpflow.files.layout import CHECKS_DIR, MLLOG_DIR, RunLayout, check_verdict_name, is_gcs, join
from rcpflow.files.storage import StorageError, storage_for
from rcpflow.records.decided import LoggedRunStop, logged_run_stop
from rcpflow.records.manifest import ManifestError, load
from rcpflow.records.mllog import Event, read_events, run_start_ms
from rcpflow.submission.rcp_numbers import RcpNumbers, rcp_numbers
from tasks.names import CHECK_TOOLS, COMPLIANCE_TOOL, RUN_DAG_ID
from tasks.results.verdicts import Verdict, read_verdict
from tasks.views.convergence import (
    ConvergenceData,
    TrainingPoint,
    convergence_data,
    seed_curve,
    tracked_training,
)

_SEED_DIR = re.compile(r"seed_([0-9]+)")  # matched whole (fullmatch), ASCII digits
SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")  # what a URL of the view can name
REPORT_MD, REPORT_HTML = "report.md", "report.html"  # a submission's report, two forms
RUN_DEPTH = 4  # how deep below the root standalone runs are looked for
# What reading a file of someone else's making can raise: unreadable storage, a file that is
# not what it should be (JSON, UTF-8, fields, numbers in range).
READ_ERRORS = (OSError, StorageError, ValueError, KeyError, TypeError, OverflowError)
T = TypeVar("T")


class NotUnderRoot(ValueError):
    """A path that is not a folder below the storage root."""


def _read(what: str, problems: list[str], fn: Callable[[], T]) -> T | None:
    """`fn()`, or None with one line naming `what` and why in `problems`."""
    try:
        return fn()
    except READ_ERRORS as exc:
        problems.append(f"{what}: {_reason(exc)}")
        return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"field {exc} missing"
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}: truncated?)"
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


@dataclass(frozen=True)
class RunSettings:
    """What every manifest row of the run agrees on."""

    seed: int
    global_batch_size: int
    val_start_at: int
    max_steps: int
    target_accuracy: float
    mllog_path: str


@dataclass(frozen=True)
class RunView:
    path: str  # relative to the storage root
    run_dir: str
    status: RunStatus  # rcpflow.cli.status
    settings: RunSettings | None  # None: no usable manifest rows
    logged_stop: LoggedRunStop | None  # None: not finalized, or finalize ended it without one
    compliance: Verdict | None
    run_start_ms: int | None = None  # the MLLOG's run_start
    training: tuple[TrainingPoint, ...] = ()  # tracked training stats of the MLLOG
    problems: tuple[str, ...] = ()  # files that could not be read, one line each
    eval_schedule: str | None = None  # the schedule the run used (`recorded_schedule`)

    @property
    def passing_step(self) -> int | None:
        """The step the gate found passing (the lower steps' summaries are all below target)."""
        return next((s.step for s in self.status.steps if s.gate == "passes"), None)

    @property
    def minutes_to_train(self) -> float | None:
        """Time to train: run_start to the run_stop of a converged run, in minutes."""
        stop = self.logged_stop
        if stop is None or stop.status != "success" or self.run_start_ms is None:
            return None
        return (stop.time_ms - self.run_start_ms) / 60_000

    @property
    def outcome(self) -> str:
        """How the run ended, in the words of its MLLOG's ``run_stop`` (or why it is not known)."""
        if self.status.manifest_error is not None:
            return f"no usable manifest: {self.status.manifest_error}"
        stop = self.logged_stop
        if stop is None:
            return "no run_stop yet"
        where = "?" if stop.step is None else str(stop.step)
        if stop.status == "success":
            return f"success: converged at step {where}"
        if stop.status == "aborted":
            return f"aborted: no checkpoint reached the target by step {where}"
        return f"{stop.status} at step {where}"


@dataclass(frozen=True)
class RunEntry:
    """One seed of a submission."""

    submission: str
    seed: int
    dag_run_id: str  # the mlperf_grpo_run run the submission triggered for this seed
    run: RunView

    @property
    def dag_id(self) -> str:
        return RUN_DAG_ID


@dataclass(frozen=True)
class SubmissionEntry:
    name: str
    folder: str
    runs: tuple[RunEntry, ...]
    verdicts: tuple[tuple[str, Verdict | None], ...]  # (tool, verdict or None: not run)
    report_path: str | None
    report_html_path: str | None  # report.html beside it (tasks.views.html_report)
    problems: tuple[str, ...] = ()  # verdict files that could not be read

    @property
    def score_minutes(self) -> float | None:
        for tool, verdict in self.verdicts:
            if tool == "result_summarizer" and verdict is not None and verdict.ok:
                return verdict.score_minutes
        return None

    @property
    def all_verdicts(self) -> list[Verdict | None]:
        """Every check of this submission: each run's compliance, then the checkers."""
        return [r.run.compliance for r in self.runs] + [v for _, v in self.verdicts]

    @property
    def verdict(self) -> str:
        """FAIL when a check that ran failed; else UNREADABLE when a verdict file cannot be
        read; PASS when every check ran and passed; else PENDING."""
        verdicts = self.all_verdicts
        if any(v is not None and not v.ok for v in verdicts):
            return "FAIL"
        lost = check_verdict_name(COMPLIANCE_TOOL)
        if self.problems or any(p.startswith(lost) for r in self.runs for p in r.run.problems):
            return "UNREADABLE"
        return "PASS" if all(v is not None for v in verdicts) else "PENDING"


@dataclass(frozen=True)
class Index:
    """What the root holds: submissions and standalone runs, by name, and what was skipped."""

    root: str
    submissions: tuple[str, ...]
    runs: tuple[str, ...]  # paths of standalone runs, relative to the root
    skipped: tuple[str, ...] = field(default=())  # names the view cannot serve, or unreadable


def _child_dirs(folder: str) -> list[str]:
    """Names of the folders directly in `folder` (sorted); none if it does not exist."""
    if is_gcs(folder):
        prefix = folder.rstrip("/") + "/"
        names = {p[len(prefix) :].split("/", 1)[0] for p in storage_for(folder).list(prefix)}
        return sorted(n for n in names if n and "/" not in n)
    if not os.path.isdir(folder):
        return []
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def _inside(root: str, path: str) -> bool:
    """Whether local `path`, symlinks resolved, is `root` (resolved) or below it."""
    real_root = os.path.realpath(root)
    return os.path.commonpath([real_root, os.path.realpath(path)]) == real_root


def resolve_under(root: str, relative: str) -> str:
    """`root`/`relative` for a relative path of plain names that stays below the root with
    symlinks resolved; NotUnderRoot otherwise."""
    parts = [p for p in relative.rstrip("/").split("/") if p]
    if (
        relative.startswith("/")
        or not parts
        or not all(SAFE_NAME.fullmatch(p) and p not in (".", "..") for p in parts)
    ):
        raise NotUnderRoot(f"{relative!r} is not a folder below the storage root")
    if is_gcs(root):
        return join(root, *parts)
    path = os.path.join(root, *parts)
    if not _inside(root, path):
        raise NotUnderRoot(f"{relative!r} is not a folder below the storage root (a symlink out)")
    return path


def confined_file(root: str, path: str) -> str:
    """`path` if it is a file below `root` with symlinks resolved (gs:// has none);
    NotUnderRoot otherwise."""
    if not is_gcs(path) and os.path.lexists(path) and not _inside(root, path):
        raise NotUnderRoot(f"{path}: links out of the storage root; not served")
    return path


def seeds_of(folder: str) -> list[int]:
    found = (_SEED_DIR.fullmatch(n) for n in _child_dirs(join(folder, "runs")))
    return sorted(int(m.group(1)) for m in found if m)


def _made_by_submission_dag(folder: str) -> bool:
    """The submission DAG's own files: verdicts of its checks, the package, the report."""
    children = set(_child_dirs(folder))
    if children & {CHECKS_DIR, "submission"}:
        return True
    report = join(folder, REPORT_MD)
    return storage_for(report).exists(report)


def _is_run(folder: str) -> bool:
    return MLLOG_DIR in _child_dirs(folder)


def index(root: str, submission_runs: Collection[str] = ()) -> Index:
    """The submissions and standalone runs under `root`. `submission_runs`: names of the
    submissions Airflow ran (a submission still training has none of its own files yet)."""
    submissions: list[str] = []
    runs: list[str] = []
    skipped: list[str] = []

    def walk(folder: str, rel: tuple[str, ...]) -> None:
        try:
            names = _child_dirs(folder)
        except READ_ERRORS as exc:
            skipped.append(f"{'/'.join(rel) or root}: {_reason(exc)}")
            return
        for name in names:
            path = (*rel, name)
            shown = "/".join(path)
            if not SAFE_NAME.fullmatch(name):
                skipped.append(f"{shown!r}: a name the view cannot serve (letters, digits, . _ -)")
                continue
            child = join(folder, name)
            if not is_gcs(child) and not _inside(root, child):
                skipped.append(f"{shown}: a symlink out of the storage root")
                continue
            try:
                if _is_run(child):
                    runs.append(shown)
                    continue
                if (
                    not rel
                    and seeds_of(child)
                    and (name in submission_runs or _made_by_submission_dag(child))
                ):
                    submissions.append(name)
                    continue
            except READ_ERRORS as exc:
                skipped.append(f"{shown}: {_reason(exc)}")
                continue
            if len(path) < RUN_DEPTH:
                walk(child, path)

    walk(root, ())
    return Index(root, tuple(submissions), tuple(runs), tuple(skipped))


def run_settings(run_dir: str) -> RunSettings | None:
    try:
        rows = load(RunLayout(run_dir).manifest).rows
    except (ManifestError, *READ_ERRORS):
        return None  # rcpflow.cli.status names the reason
    if not rows:
        return None
    r = rows[0]
    return RunSettings(
        r.seed, r.global_batch_size, r.val_start_at, r.max_steps, r.target_accuracy, r.mllog_file
    )


def recorded_schedule(run_dir: str) -> str | None:
    """The evaluation schedule the run used, as one line with what the rules say of it
    (`rcpflow.verdict.schedule_record`); None for a run whose plan recorded none; the problem when
    the record is unreadable."""
    from rcpflow.verdict.schedule_record import ScheduleRecordError, read_schedule

    try:
        record = read_schedule(run_dir)
    except (ScheduleRecordError, StorageError) as e:
        return f"unreadable schedule record: {e}"
    return None if record is None else f"{record.eval_schedule}: {record.statement()}"


def run_view(root: str, path: str) -> RunView:
    """The run at `path` below `root` (NotUnderRoot if `path` is not a plain relative path)."""
    return read_run(resolve_under(root, path), path.strip("/"))


def _unknown_status(run_dir: str, why: str) -> RunStatus:
    layout = RunLayout(run_dir)
    return RunStatus(layout.root, layout.manifest, why, (), (), None)


def read_run(run_dir: str, path: str) -> RunView:
    """The run in `run_dir`, named `path` (how the caller shows it); every file is read once."""
    problems: list[str] = []
    status = _read("status", problems, lambda: run_status(run_dir))
    if status is None:
        status = _unknown_status(run_dir, problems[-1])
    settings = run_settings(run_dir)
    events: list[Event] | None = None
    if settings is not None:
        mllog = settings.mllog_path
        events = _read(f"MLLOG {mllog}", problems, lambda: read_events(mllog))
    stop = None
    if events is not None and settings is not None:
        stop = logged_run_stop(events, settings.global_batch_size)
        if stop is not None and stop.samples_count is None:
            problems.append("run_stop in the MLLOG has no samples_count: its step is unknown")
    compliance = _read(
        check_verdict_name(COMPLIANCE_TOOL),
        problems,
        lambda: read_verdict(run_dir, COMPLIANCE_TOOL),
    )
    return RunView(
        path=path,
        run_dir=run_dir,
        status=status,
        settings=settings,
        logged_stop=stop,
        compliance=compliance,
        run_start_ms=None if events is None else run_start_ms(events),
        training=() if events is None else tracked_training(events),
        problems=tuple(problems),
        eval_schedule=recorded_schedule(run_dir),
    )


def run_entry(root: str, submission: str, seed: int) -> RunEntry:
    path = posixpath.join(submission, "runs", f"seed_{seed}")
    return RunEntry(submission, seed, f"{submission}__seed_{seed}", run_view(root, path))


def submission_entry(root: str, name: str) -> SubmissionEntry:
    folder = resolve_under(root, name)
    seeds = seeds_of(folder)
    if not seeds:
        raise NotUnderRoot(f"{name!r}: no submission (no runs/seed_<s>/) under {root}")
    problems: list[str] = []

    def verdict(tool: str) -> Verdict | None:
        return _read(check_verdict_name(tool), problems, lambda: read_verdict(folder, tool))

    verdicts = tuple((tool, verdict(tool)) for tool in CHECK_TOOLS)
    report, html = join(folder, REPORT_MD), join(folder, REPORT_HTML)
    return SubmissionEntry(
        name=name,
        folder=folder,
        runs=tuple(run_entry(root, name, s) for s in seeds),
        verdicts=verdicts,
        report_path=report if storage_for(report).exists(report) else None,
        report_html_path=html if storage_for(html).exists(html) else None,
        problems=tuple(problems),
    )


def rcp_inputs(runs: Sequence[RunView]) -> tuple[dict[int, int | None], int] | None:
    """Each seed's samples to converge (None: no successful run_stop) and the batch size, for
    `rcpflow.submission.rcp_numbers`; None when the runs have no one batch size."""
    sizes = {r.settings.global_batch_size for r in runs if r.settings is not None}
    if len(sizes) != 1 or any(r.settings is None for r in runs):
        return None
    samples = {
        r.settings.seed: (
            r.logged_stop.samples_count
            if r.logged_stop is not None and r.logged_stop.status == "success"
            else None
        )
        for r in runs
        if r.settings is not None
    }
    return samples, sizes.pop()


def rcp_numbers_of(runs: Sequence[RunView]) -> RcpNumbers | None:
    """The RCP checker's numbers for these runs (a submission's seeds); None without one batch
    size or without the official RCP file."""
    inputs = rcp_inputs(runs)
    if inputs is None:
        return None
    try:
        return rcp_numbers(*inputs)
    except (ImportError, OSError, KeyError, ValueError):
        return None  # no official RCP file to read: the page says the numbers are unknown


def convergence(title: str, runs: Sequence[RunView]) -> ConvergenceData:
    """The convergence plot's data for these runs (one submission's, or runs to compare)."""
    settings = [r.settings for r in runs if r.settings is not None]
    sizes = {s.global_batch_size for s in settings}
    targets = {s.target_accuracy for s in settings}
    curves = [
        seed_curve(r.path, r.settings.seed, r.status, r.run_start_ms, r.training)
        for r in runs
        if r.settings is not None
    ]
    return convergence_data(
        title,
        curves,
        sizes.pop() if len(sizes) == 1 else None,  # a mix has no one reference point
        targets.pop() if len(targets) == 1 else recipe.TARGET_ACCURACY,
    )
