"""What lies under a storage root: the submissions, their runs and every persisted verdict.

A submission is a folder ``<root>/<name>/`` with ``runs/seed_<s>/`` (see `tasks.submission`);
its checker verdicts are the ``checks/<tool>.json`` files the check tasks wrote, a run's
compliance verdict its own ``checks/compliance_checker.json``. Everything is read from storage
(rcpflow's readers, `tasks.verdicts`), nothing is recomputed: this is what the RCP view and the
HTML report show. Paths handed in from outside (a URL) are resolved with `resolve_under`, which
refuses anything that is not below the root.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass

from rcpflow.layout import is_gcs, join
from rcpflow.storage import storage_for
from tasks.status_adapter import RunStatus, run_status
from tasks.submission import CHECK_TOOLS, RUN_DAG_ID
from tasks.verdicts import Verdict, read_verdict

_SEED_DIR = re.compile(r"^seed_(\d+)$")
_SAFE_PART = re.compile(r"^[A-Za-z0-9._-]+$")
COMPLIANCE_TOOL = "compliance_checker"


class NotUnderRoot(ValueError):
    """A path that is not a folder below the storage root."""


@dataclass(frozen=True)
class RunEntry:
    submission: str
    seed: int
    path: str  # relative to the storage root
    run_dir: str
    dag_run_id: str  # the mlperf_grpo_run run the submission triggered for this seed
    status: RunStatus
    compliance: Verdict | None

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

    @property
    def score_minutes(self) -> float | None:
        for tool, verdict in self.verdicts:
            if tool == "result_summarizer" and verdict is not None and verdict.ok:
                return verdict.score_minutes
        return None

    @property
    def all_verdicts(self) -> list[Verdict | None]:
        """Every check of this submission: each run's compliance, then the checkers."""
        return [r.compliance for r in self.runs] + [v for _, v in self.verdicts]

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


def run_entry(root: str, submission: str, seed: int) -> RunEntry:
    path = posixpath.join(submission, "runs", f"seed_{seed}")
    run_dir = resolve_under(root, path)
    return RunEntry(
        submission=submission,
        seed=seed,
        path=path,
        run_dir=run_dir,
        dag_run_id=f"{submission}__seed_{seed}",
        status=run_status(run_dir),
        compliance=read_verdict(run_dir, COMPLIANCE_TOOL),
    )


def submission_entry(root: str, name: str) -> SubmissionEntry:
    folder = resolve_under(root, name)
    seeds = seeds_of(folder)
    if not seeds:
        raise NotUnderRoot(f"{name!r}: no submission (no runs/seed_<s>/) under {root}")
    report = join(folder, "report.md")
    return SubmissionEntry(
        name=name,
        folder=folder,
        runs=tuple(run_entry(root, name, s) for s in seeds),
        verdicts=tuple((tool, read_verdict(folder, tool)) for tool in CHECK_TOOLS),
        report_path=report if storage_for(report).exists(report) else None,
    )
