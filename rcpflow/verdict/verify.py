"""Whether a run's evaluation of one checkpoint stands: its summary, checked against everything.

One answer for the gate, finalize and `rcpflow status`: the summary at ``eval/step_<n>/`` must be
readable, valid for the manifest row (`rcpflow.records.summary_checks`) and, when the attempts it
was built from are there (``attempts/attempts.jsonl``, any format `rcpflow.records.attempts` reads),
give the same pass@k as they do. Anything else is not a pass.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from rcpflow.files import jsonio
from rcpflow.files.layout import RunLayout, join
from rcpflow.files.storage import storage_for
from rcpflow.records.attempts import AttemptsError, parse_attempts
from rcpflow.records.manifest import ManifestRow
from rcpflow.records.summary import EvalSummary, SummaryError, read_summary
from rcpflow.records.summary_checks import Problem, recomputed_problems, validity_problems

ATTEMPTS_FILE = "attempts.jsonl"
SummaryState = Literal["missing", "unreadable", "invalid", "valid"]


@dataclass(frozen=True)
class StepEvaluation:
    """What the run holds for one checkpoint's evaluation."""

    step: int
    summary_path: str
    state: SummaryState
    summary: EvalSummary | None  # None when missing or unreadable
    problems: tuple[str, ...]  # why it is not valid; empty when valid

    @property
    def valid(self) -> bool:
        return self.state == "valid"


def attempts_file(run_dir: str, step: int) -> str:
    return join(RunLayout(run_dir).attempts_dir(step), ATTEMPTS_FILE)


def attempts_problems(summary: EvalSummary, path: str) -> list[Problem]:
    """`summary` against the attempts file at `path` (which must exist)."""
    try:
        found = parse_attempts(jsonio.decode_utf8(storage_for(path).read_bytes(path), path), path)
    except (AttemptsError, jsonio.JSONInputError) as e:
        return [Problem("attempts", str(e))]
    return recomputed_problems(summary, found.per_instance(), where=path)


def check_summary(
    summary: EvalSummary, row: ManifestRow, attempts_path: str | None
) -> list[Problem]:
    """Validity for `row`, plus agreement with the attempts file if one is given."""
    problems = validity_problems(summary, row)
    if attempts_path is not None:
        problems += attempts_problems(summary, attempts_path)
    return problems


# While `reading_once` is active (in this thread or task): evaluations by (run, row).
_READ_ONCE: contextvars.ContextVar[dict[tuple[str, ManifestRow], StepEvaluation] | None] = (
    contextvars.ContextVar("rcpflow_verify_read_once", default=None)
)


@contextlib.contextmanager
def reading_once() -> Iterator[None]:
    """Within the block, each (run, row) is evaluated once: a reader that asks the gate, the
    verdict and each step (`rcpflow.cli.status`) reads every summary once, in linear time. Only for
    one consistent look at the run: files written meanwhile are not seen."""
    token = _READ_ONCE.set({}) if _READ_ONCE.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _READ_ONCE.reset(token)


def evaluate_step(run_dir: str, row: ManifestRow) -> StepEvaluation:
    cache = _READ_ONCE.get()
    if cache is None:
        return _evaluate_step(run_dir, row)
    key = (RunLayout(run_dir).root, row)
    found = cache.get(key)
    if found is None:
        found = cache[key] = _evaluate_step(run_dir, row)
    return found


def _evaluate_step(run_dir: str, row: ManifestRow) -> StepEvaluation:
    path = RunLayout(run_dir).summary(row.step)
    if not storage_for(path).exists(path):
        return StepEvaluation(row.step, path, "missing", None, ("no summary",))
    try:
        summary = read_summary(path)
    except SummaryError as e:
        return StepEvaluation(row.step, path, "unreadable", None, (str(e),))
    attempts = attempts_file(run_dir, row.step)
    problems = check_summary(
        summary, row, attempts if storage_for(attempts).exists(attempts) else None
    )
    state: SummaryState = "invalid" if problems else "valid"
    return StepEvaluation(row.step, path, state, summary, tuple(str(p) for p in problems))
