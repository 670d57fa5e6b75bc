"""What lies under a storage root: the submissions, their runs and every persisted verdict.

A submission is a folder ``<root>/<name>/`` with ``runs/seed_<s>/`` (see `tasks.submission.spec`);
its checker verdicts are the ``checks/<tool>.json`` files the check tasks wrote, a run's
compliance verdict its own ``checks/compliance_checker.json``. A run is what `rcpflow.status`
says of it (per step: checkpoint, summary, gate; what finalize would write), with the settings
its manifest rows carry and the ``run_stop`` its MLLOG holds. Everything is read from storage
with rcpflow's readers and `tasks.verdicts`, nothing is decided here: this is what the RCP view,
the convergence plot and the HTML report show. Paths handed in from outside (a URL) are
resolved with `resolve_under`, which refuses anything that is not below the root.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from rcpflow import recipe
from rcpflow.layout import RunLayout, is_gcs, join
from rcpflow.manifest import ManifestError, load
from rcpflow.mllog import MLLogError, read_events
from rcpflow.status import RunStatus, run_status
from rcpflow.storage import storage_for
from tasks.convergence import ConvergenceData, convergence_data, seed_curve
from tasks.names import CHECK_TOOLS, COMPLIANCE_TOOL, RUN_DAG_ID
from tasks.verdicts import Verdict, read_verdict

_SEED_DIR = re.compile(r"^seed_(\d+)$")
_SAFE_PART = re.compile(r"^[A-Za-z0-9._-]+$")
REPORT_MD, REPORT_HTML = "report.md", "report.html"  # a submission's report, two forms


class NotUnderRoot(ValueError):
    """A path that is not a folder below the storage root."""


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
class LoggedStop:
    """The ``run_stop`` finalize wrote into the MLLOG."""

    status: str
    time_ms: int
    samples_count: int
    step: int


@dataclass(frozen=True)
class RunView:
    path: str  # relative to the storage root
    run_dir: str
    status: RunStatus  # rcpflow.status
    settings: RunSettings | None  # None: no usable manifest rows
    logged_stop: LoggedStop | None  # None: not finalized, or finalize ended it without one
    compliance: Verdict | None

    @property
    def passing_step(self) -> int | None:
        """The step the gate found passing (the lower steps' summaries are all below target)."""
        return next((s.step for s in self.status.steps if s.gate == "passes"), None)


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
    report_html_path: str | None  # report.html beside it (tasks.html_report)

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
        """PASS when every check ran and passed, FAIL when one that ran failed, else PENDING."""
        verdicts = self.all_verdicts
        if any(v is not None and not v.ok for v in verdicts):
            return "FAIL"
        return "PASS" if all(v is not None for v in verdicts) else "PENDING"


def _child_dirs(folder: str) -> list[str]:
    """Names of the folders directly in `folder` (sorted); none if it does not exist."""
    if is_gcs(folder):
        prefix = folder.rstrip("/") + "/"
        names = {p[len(prefix) :].split("/", 1)[0] for p in storage_for(folder).list(prefix)}
        return sorted(n for n in names if n and "/" not in n)
    if not os.path.isdir(folder):
        return []
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def resolve_under(root: str, relative: str) -> str:
    """`root`/`relative` for a relative path of plain names; NotUnderRoot otherwise."""
    parts = [p for p in relative.rstrip("/").split("/") if p]
    if (
        relative.startswith("/")
        or not parts
        or not all(_SAFE_PART.match(p) and p not in (".", "..") for p in parts)
    ):
        raise NotUnderRoot(f"{relative!r} is not a folder below the storage root")
    return join(root, *parts) if is_gcs(root) else os.path.join(root, *parts)


def seeds_of(folder: str) -> list[int]:
    found = (_SEED_DIR.match(n) for n in _child_dirs(join(folder, "runs")))
    return sorted(int(m.group(1)) for m in found if m)


def submission_names(root: str) -> list[str]:
    return [n for n in _child_dirs(root) if seeds_of(join(root, n))]


def run_settings(run_dir: str) -> RunSettings | None:
    try:
        rows = load(RunLayout(run_dir).manifest).rows
    except ManifestError:
        return None  # rcpflow.status names the reason
    if not rows:
        return None
    r = rows[0]
    return RunSettings(
        r.seed, r.global_batch_size, r.val_start_at, r.max_steps, r.target_accuracy, r.mllog_file
    )


def _logged_stop(settings: RunSettings) -> LoggedStop | None:
    try:
        events = read_events(settings.mllog_path)
    except (FileNotFoundError, MLLogError):
        return None
    stops = [e for e in events if e.key == "run_stop"]
    if not stops:
        return None
    stop = stops[-1]
    samples = int(stop.metadata["samples_count"])
    status = str(stop.metadata["status"])
    return LoggedStop(status, stop.time_ms, samples, samples // settings.global_batch_size)


def run_view(root: str, path: str) -> RunView:
    """The run at `path` below `root` (NotUnderRoot if `path` is not a plain relative path)."""
    return read_run(resolve_under(root, path), path.strip("/"))


def read_run(run_dir: str, path: str) -> RunView:
    """The run in `run_dir`, named `path` (how the caller shows it)."""
    settings = run_settings(run_dir)
    return RunView(
        path=path,
        run_dir=run_dir,
        status=run_status(run_dir),
        settings=settings,
        logged_stop=_logged_stop(settings) if settings else None,
        compliance=read_verdict(run_dir, COMPLIANCE_TOOL),
    )


def run_entry(root: str, submission: str, seed: int) -> RunEntry:
    path = posixpath.join(submission, "runs", f"seed_{seed}")
    return RunEntry(submission, seed, f"{submission}__seed_{seed}", run_view(root, path))


def submission_entry(root: str, name: str) -> SubmissionEntry:
    folder = resolve_under(root, name)
    seeds = seeds_of(folder)
    if not seeds:
        raise NotUnderRoot(f"{name!r}: no submission (no runs/seed_<s>/) under {root}")
    report, html = join(folder, REPORT_MD), join(folder, REPORT_HTML)
    return SubmissionEntry(
        name=name,
        folder=folder,
        runs=tuple(run_entry(root, name, s) for s in seeds),
        verdicts=tuple((tool, read_verdict(folder, tool)) for tool in CHECK_TOOLS),
        report_path=report if storage_for(report).exists(report) else None,
        report_html_path=html if storage_for(html).exists(html) else None,
    )


def convergence(title: str, runs: Sequence[RunView]) -> ConvergenceData:
    """The convergence plot's data for these runs (one submission's, or a single run)."""
    settings = [r.settings for r in runs if r.settings is not None]
    sizes = {s.global_batch_size for s in settings}
    targets = {s.target_accuracy for s in settings}
    curves = [seed_curve(r.settings.seed, r.status) for r in runs if r.settings is not None]
    return convergence_data(
        title,
        curves,
        sizes.pop() if len(sizes) == 1 else None,  # a mix has no one reference point
        targets.pop() if len(targets) == 1 else recipe.TARGET_ACCURACY,
    )
