"""Taking the result of a foreign evaluate job into the run (`rcpflow.verdict.eval_import`).

A job whose result is not rcpflow's own summary leaves it where the deployment's
``jobs.evaluate.result`` says. The evaluate step reads the wall clock right before it starts the
job and right after the job ends, and imports the result with those as the eval times (the
pipeline's clock, as Tunix's pipeline does: its summaries carry none). Only what the job itself
left counts: what was at the result path before it started (the `Baseline`) is never imported,
so an old result cannot pass for this evaluation with times it was not evaluated in.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rcpflow.files.storage import storage_for
from rcpflow.verdict.eval_import import (
    SOURCE_FORMATS,
    EvalImportError,
    ImportResult,
    import_eval,
    tree_summaries,
)
from tasks.jobs.templates import EvalResult
from tasks.jobs.values import Values

log = logging.getLogger(__name__)


class EvaluationError(RuntimeError):
    """An evaluation job finished without leaving a valid summary; the message says why."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Baseline:
    """What was at a step's result path before its job started: the tree's attempts of that
    step (tunix-tree), or the file's sha256 (None: no file)."""

    attempts: tuple[str, ...] = ()
    digest: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"attempts": list(self.attempts), "digest": self.digest}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Baseline:
        return cls(attempts=tuple(d["attempts"]), digest=d["digest"])


def _digest(path: str) -> str | None:
    storage = storage_for(path)
    if not storage.exists(path):
        return None
    return hashlib.sha256(storage.read_bytes(path)).hexdigest()


def baseline(result: EvalResult, values: Values) -> Baseline:
    """What is at the result path of the step `values` are for, before its job runs."""
    path = result.render(values)
    if result.format == "tunix-tree":
        return Baseline(attempts=tuple(tree_summaries(path).get(int(values["step"]), [])))
    return Baseline(digest=_digest(path))


def import_result(
    result: EvalResult,
    values: Values,
    before: Baseline,
    eval_times: tuple[int, int],
) -> ImportResult:
    """Import what the job left for its step, with `eval_times`; EvaluationError naming the
    path and why when it left nothing new or nothing valid (nothing is written then)."""
    run_dir, step = str(values["run_dir"]), int(values["step"])
    path = result.render(values)
    if result.format == "tunix-tree":
        new = [p for p in tree_summaries(path).get(step, []) if p not in before.attempts]
        if not new:
            raise EvaluationError(
                f"step {step}: the evaluate job left no new attempt under {path}/step_{step}/"
            )
        rejected = []
        for source in new:  # newest first
            try:
                return import_eval(run_dir, step, source, eval_times=eval_times)
            except EvalImportError as exc:
                rejected.append(str(exc))
        raise EvaluationError(f"step {step}: nothing the job left imports: {'; '.join(rejected)}")
    digest = _digest(path)
    if digest is None:
        raise EvaluationError(f"step {step}: the evaluate job left no result at {path}")
    if digest == before.digest:
        raise EvaluationError(
            f"step {step}: {path} is the same file as before the job ran: not this evaluation"
        )
    fmt = SOURCE_FORMATS[SOURCE_FORMATS.index(result.format)]  # a file format: one of these
    # NeMo-RL's evaluator logs its own eval_start/eval_stop around the evaluation: those.
    times = None if fmt == "nemo-rl-mllog" else eval_times
    try:
        return import_eval(run_dir, step, path, eval_times=times, fmt=fmt)
    except EvalImportError as exc:
        raise EvaluationError(f"step {step}: {exc}") from exc
