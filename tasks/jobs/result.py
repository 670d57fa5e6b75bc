"""Taking the result of a foreign evaluate job into the run (`rcpflow.verdict.eval_import`).

A job whose result is not rcpflow's own summary leaves it where the deployment's
``jobs.evaluate.result`` says. The evaluate step reads the wall clock right before it starts the
job and right after the job ends, and imports the result with those as the eval times (the
pipeline's clock, as Tunix's pipeline does: its summaries carry none). Only what the job itself
left counts: what was at the result path before it started (the `Baseline`) is never imported,
so an old result cannot pass for this evaluation with times it was not evaluated in. The rule
itself is `rcpflow.verdict.eval_import.import_new_result`'s, which the Slurm batch script that
evaluates in the training's allocation also runs (`rcpflow eval import --since`).
"""

from __future__ import annotations

import time

from rcpflow.verdict.eval_import import (
    Baseline,
    EvalImportError,
    ImportResult,
    import_new_result,
    result_baseline,
)
from tasks.jobs.templates import EvalResult
from tasks.jobs.values import Values

__all__ = ["Baseline", "EvaluationError", "baseline", "import_result", "now_ms"]


class EvaluationError(RuntimeError):
    """An evaluation job finished without leaving a valid summary; the message says why."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def baseline(result: EvalResult, values: Values) -> Baseline:
    """What is at the result path of the step `values` are for, before its job runs."""
    return result_baseline(result.format, result.render(values), int(values["step"]))


def import_result(
    result: EvalResult,
    values: Values,
    before: Baseline,
    eval_times: tuple[int, int],
) -> ImportResult:
    """Import what the job left for its step, with `eval_times`; EvaluationError naming the
    path and why when it left nothing new or nothing valid (nothing is written then)."""
    run_dir, step = str(values["run_dir"]), int(values["step"])
    try:
        return import_new_result(
            run_dir, step, result.format, result.render(values), before, eval_times
        )
    except EvalImportError as exc:
        raise EvaluationError(str(exc)) from exc
