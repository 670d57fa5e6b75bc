"""Whether an eval summary may stand for its checkpoint: every check, as `Problem`s naming fields.

Nothing a summary says about itself is trusted (docs/design.md, verification of foreign inputs):
`consistency_problems` checks it against itself and the benchmark (251 instances x 4 attempts),
`row_problems` against its checkpoint's manifest row, `recomputed_problems` against the attempts
it was built from; `validity_problems` is all but the last, plus completeness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rcpflow import recipe
from rcpflow.records.manifest import ManifestRow
from rcpflow.records.passk import mean_pass_at_k
from rcpflow.records.summary import PASS_KS, AttemptResult, EvalSummary, count_attempts, task_counts

# Tolerance of float equalities (pass@1 = resolved/expected, pass@k recomputed): far below the
# 1/1004 resolution of the counts, far above the rounding of a sum over 251 tasks.
FLOAT_TOLERANCE = 1e-9
COUNT_FIELDS = (
    "instances",
    "attempts_per_instance",
    "expected_attempts",
    "completed_attempts",
    "missing_attempts",
    "error_attempts",
    "resolved_attempts",
)


@dataclass(frozen=True)
class Problem:
    """One reason a summary is not valid, naming the field(s) at fault."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= FLOAT_TOLERANCE


def consistency_problems(s: EvalSummary) -> list[Problem]:
    """Every way `s` contradicts itself or the benchmark (251 instances x 4 attempts)."""
    out: list[Problem] = []
    if s.instances != recipe.EVAL_SAMPLES:
        out.append(
            Problem("instances", f"{s.instances}, the benchmark evaluates {recipe.EVAL_SAMPLES}")
        )
    if s.attempts_per_instance != recipe.EVAL_ATTEMPTS_PER_INSTANCE:
        out.append(
            Problem(
                "attempts_per_instance",
                f"{s.attempts_per_instance}, pass@{recipe.PASS_K} needs "
                f"{recipe.EVAL_ATTEMPTS_PER_INSTANCE}",
            )
        )
    negative = [n for n in COUNT_FIELDS if getattr(s, n) < 0]
    out += [Problem(n, f"{getattr(s, n)} is negative") for n in negative]
    if s.expected_attempts != s.instances * s.attempts_per_instance:
        out.append(
            Problem(
                "expected_attempts",
                f"{s.expected_attempts} != instances x attempts_per_instance = "
                f"{s.instances * s.attempts_per_instance}",
            )
        )
    if s.completed_attempts + s.missing_attempts != s.expected_attempts:
        out.append(
            Problem(
                "completed_attempts, missing_attempts",
                f"{s.completed_attempts} + {s.missing_attempts} != expected_attempts "
                f"{s.expected_attempts}",
            )
        )
    if s.resolved_attempts > s.completed_attempts:
        out.append(
            Problem(
                "resolved_attempts",
                f"{s.resolved_attempts} > completed_attempts {s.completed_attempts}",
            )
        )
    if s.error_attempts > s.completed_attempts:
        out.append(
            Problem(
                "error_attempts", f"{s.error_attempts} > completed_attempts {s.completed_attempts}"
            )
        )
    if s.complete != (s.missing_attempts == 0):
        out.append(Problem("complete", f"{s.complete} with {s.missing_attempts} missing attempts"))
    counted = sum(s.status_counts.values())
    if counted != s.completed_attempts or any(v < 0 for v in s.status_counts.values()):
        out.append(
            Problem(
                "status_counts",
                f"sum to {counted}, completed_attempts is {s.completed_attempts}",
            )
        )
    out += _pass_at_k_problems(s)
    if not 0.0 <= s.avg_at_k <= 1.0:
        out.append(Problem("avg_at_k", f"{s.avg_at_k} is not in [0, 1]"))
    elif s.complete and s.expected_attempts > 0 and s.attempt_records:
        rate = s.resolved_attempts / s.expected_attempts
        if not _close(s.avg_at_k, rate):
            out.append(Problem("avg_at_k", f"{s.avg_at_k} != resolved/expected attempts = {rate}"))
    if s.target_accuracy != recipe.TARGET_ACCURACY:
        out.append(
            Problem(
                "target_accuracy",
                f"{s.target_accuracy} is not the benchmark's {recipe.TARGET_ACCURACY}",
            )
        )
    if not math.isfinite(s.mean_reward):
        out.append(Problem("mean_reward", f"{s.mean_reward} is not a finite number"))
    for name in ("eval_start_ms", "eval_stop_ms"):
        problem = recipe.time_problem(getattr(s, name))
        if problem is not None:
            out.append(Problem(name, problem))
    if s.eval_stop_ms < s.eval_start_ms:
        out.append(
            Problem("eval_stop_ms", f"{s.eval_stop_ms} is before eval_start_ms {s.eval_start_ms}")
        )
    return out


def _pass_at_k_problems(s: EvalSummary) -> list[Problem]:
    if not s.attempt_records:
        return _accuracy_only_problems(s)
    out: list[Problem] = []
    want = {str(k) for k in PASS_KS}
    if not want <= set(s.pass_at_k):
        have = ", ".join(sorted(s.pass_at_k)) or "none"
        return [Problem("pass_at_k", f"needs keys {sorted(want)}, has {have}")]
    for key, value in sorted(s.pass_at_k.items()):
        if not key.isdigit() or not 1 <= int(key) <= s.attempts_per_instance:
            out.append(Problem("pass_at_k", f"key {key!r} is not a k in 1..attempts_per_instance"))
        elif not 0.0 <= value <= 1.0:
            out.append(Problem(f'pass_at_k["{key}"]', f"{value} is not in [0, 1]"))
    if out or s.expected_attempts <= 0 or s.instances <= 0:
        return out
    p1 = s.pass_at_k["1"]
    if not _close(p1, s.resolved_attempts / s.expected_attempts):
        out.append(
            Problem(
                'pass_at_k["1"]',
                f"{p1} != resolved/expected attempts = {s.resolved_attempts}/{s.expected_attempts}",
            )
        )
    k = str(recipe.PASS_K)
    solved = s.pass_at_k[k] * s.instances
    whole = round(solved)
    # With n = k = 4 attempts, a task's pass@4 is 0 or 1, so the mean is (tasks solved)/instances;
    # a solved task holds 1..4 of the resolved attempts.
    if not math.isclose(solved, whole, abs_tol=1e-6):
        out.append(
            Problem(
                f'pass_at_k["{k}"]',
                f"{s.pass_at_k[k]} x {s.instances} instances = {solved:.6f} is not a whole "
                "number of solved tasks",
            )
        )
    elif not math.ceil(s.resolved_attempts / recipe.PASS_K) <= whole <= s.resolved_attempts:
        out.append(
            Problem(
                f'pass_at_k["{k}"]',
                f"{whole} solved tasks cannot hold {s.resolved_attempts} resolved attempts "
                f"(between resolved/{recipe.PASS_K} and resolved)",
            )
        )
    return out


def _accuracy_only_problems(s: EvalSummary) -> list[Problem]:
    """A summary without per-attempt records states pass@4 alone, in [0, 1], and claims no
    resolved attempt; its pass@4 is taken as logged (nothing to recompute it from)."""
    k = str(recipe.PASS_K)
    if set(s.pass_at_k) != {k}:
        have = ", ".join(sorted(s.pass_at_k)) or "none"
        return [Problem("pass_at_k", f"without attempt records only pass@{k}, has {have}")]
    value = s.pass_at_k[k]
    if not 0.0 <= value <= 1.0:
        return [Problem(f'pass_at_k["{k}"]', f"{value} is not in [0, 1]")]
    out = []
    if s.resolved_attempts != 0:
        out.append(Problem("resolved_attempts", f"{s.resolved_attempts} without attempt records"))
    return out


def recomputed_problems(
    s: EvalSummary, attempts: Sequence[Sequence[AttemptResult]], where: str
) -> list[Problem]:
    """`s` against the attempts it claims to summarise (`where` names that file): every count
    it states (attempts, status_counts) and its pass@k."""
    if len(attempts) > s.instances or s.attempts_per_instance < recipe.PASS_K:
        return [
            Problem("instances", f"{len(attempts)} tasks in {where}, summary says {s.instances}")
        ]
    if any(len(a) > s.attempts_per_instance for a in attempts):
        return [
            Problem(
                "attempts_per_instance",
                f"{where} has a task with more than {s.attempts_per_instance} attempts",
            )
        ]
    again = count_attempts(attempts, s.attempts_per_instance, s.instances)
    out = [
        Problem(name, f"{getattr(s, name)} but {where} gives {getattr(again, name)}")
        for name in (*COUNT_FIELDS, "status_counts")
        if getattr(s, name) != getattr(again, name)
    ]
    per_task = task_counts(attempts, s.attempts_per_instance, s.instances)
    for key, value in sorted(s.pass_at_k.items()):
        if not key.isdigit() or not 1 <= int(key) <= s.attempts_per_instance:
            continue  # already named by consistency_problems
        recomputed = mean_pass_at_k(per_task, int(key))
        if not _close(value, recomputed):
            out.append(Problem(f'pass_at_k["{key}"]', f"{value} but {where} gives {recomputed}"))
    return out


def row_problems(s: EvalSummary, row: ManifestRow) -> list[Problem]:
    """Whether `s` is about `row`'s checkpoint, evaluated after it existed."""
    out = [
        Problem(name, f"{got} != manifest's {want} (a summary of another checkpoint)")
        for name, got, want in (
            ("checkpoint_step", s.checkpoint_step, row.step),
            ("checkpoint_timestamp_ms", s.checkpoint_timestamp_ms, row.timestamp_ms),
            ("samples_count", s.samples_count, row.samples_count),
        )
        if got != want
    ]
    if s.eval_start_ms < row.timestamp_ms:
        out.append(
            Problem(
                "eval_start_ms",
                f"{s.eval_start_ms} is before the checkpoint's weight update {row.timestamp_ms}",
            )
        )
    return out


def validity_problems(s: EvalSummary, row: ManifestRow) -> list[Problem]:
    """Everything that keeps `s` from standing for `row`'s checkpoint; empty when it is valid."""
    out: list[Problem] = []
    if not s.complete:
        out.append(Problem("complete", f"incomplete ({s.missing_attempts} missing attempts)"))
    if s.fatal_error is not None:
        out.append(Problem("fatal_error", f"fatal error: {s.fatal_error}"))
    if s.expected_attempts > 0 and s.error_attempts >= s.expected_attempts:
        out.append(Problem("error_attempts", f"all {s.expected_attempts} attempts errored"))
    seen = {str(p) for p in out}
    out += [p for p in consistency_problems(s) + row_problems(s, row) if str(p) not in seen]
    return out
