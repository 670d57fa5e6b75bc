"""The result of evaluating one checkpoint: ``eval/step_<n>/summary.json``.

The evaluator builds it from per-attempt results; finalize and the short-circuit gate read it.
A summary is *valid* for a manifest row when the evaluation is complete, had no fatal error, not
every attempt errored, and it is about that row's checkpoint (same step, timestamp, samples).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rcpflow import jsonio, recipe
from rcpflow.manifest import ManifestRow
from rcpflow.passk import mean_pass_at_k
from rcpflow.storage import storage_for

ATTEMPT_STATUSES = ("resolved", "failed", "error", "missing")
PASS_KS = (1, recipe.PASS_K)


class SummaryError(ValueError):
    """A summary file that cannot be read as a summary; the message names the file and field."""


@dataclass(frozen=True)
class AttemptResult:
    """One attempt at one instance: resolved (reward 1) or failed, or error (no answer)."""

    status: str
    reward: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in ATTEMPT_STATUSES[:3]:
            raise ValueError(
                f"attempt status must be resolved, failed or error, got {self.status!r}"
            )


@dataclass(frozen=True)
class EvalSummary:
    instances: int
    attempts_per_instance: int
    expected_attempts: int
    completed_attempts: int
    missing_attempts: int
    error_attempts: int
    resolved_attempts: int
    avg_at_k: dict[str, float]
    pass_at_k: dict[str, float]
    mean_reward: float
    status_counts: dict[str, int]
    complete: bool
    fatal_error: str | None
    target_accuracy: float
    target_reached: bool
    checkpoint_step: int
    checkpoint_timestamp_ms: int
    samples_count: int
    eval_start_ms: int
    eval_stop_ms: int

    @property
    def eval_accuracy(self) -> float:
        return self.pass_at_k[str(recipe.PASS_K)]

    @property
    def validation_time_s(self) -> float:
        return (self.eval_stop_ms - self.eval_start_ms) / 1000.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> EvalSummary:
        try:
            d = jsonio.loads(text, where)  # duplicate keys, NaN, too deep: invalid
        except jsonio.JSONInputError as e:
            raise SummaryError(str(e)) from e
        if not isinstance(d, dict):
            raise SummaryError(f"{where}: a summary must be a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        missing = sorted(set(fields) - set(d))
        if missing:
            raise SummaryError(f"{where}: missing field(s) {', '.join(missing)}")
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise SummaryError(f"{where}: unknown field(s) {', '.join(unknown)}")
        for name, expected in _FIELD_TYPES.items():
            value = d[name]
            if not _is(value, expected):
                raise SummaryError(f"{where}: field {name} has the wrong type: {value!r}")
        acc = d["pass_at_k"].get(str(recipe.PASS_K))
        if not _is(acc, float) or not 0.0 <= acc <= 1.0:
            raise SummaryError(f'{where}: pass_at_k["{recipe.PASS_K}"] must be in [0, 1]')
        return cls(**d)


def _is(value: Any, expected: Any) -> bool:
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "str|None":
        return value is None or isinstance(value, str)
    if expected == "dict[float]":
        return isinstance(value, dict) and all(_is(v, float) for v in value.values())
    if expected == "dict[int]":
        return isinstance(value, dict) and all(_is(v, int) for v in value.values())
    return isinstance(value, expected)


_FIELD_TYPES: dict[str, Any] = {
    "instances": int,
    "attempts_per_instance": int,
    "expected_attempts": int,
    "completed_attempts": int,
    "missing_attempts": int,
    "error_attempts": int,
    "resolved_attempts": int,
    "avg_at_k": "dict[float]",
    "pass_at_k": "dict[float]",
    "mean_reward": float,
    "status_counts": "dict[int]",
    "complete": bool,
    "fatal_error": "str|None",
    "target_accuracy": float,
    "target_reached": bool,
    "checkpoint_step": int,
    "checkpoint_timestamp_ms": int,
    "samples_count": int,
    "eval_start_ms": int,
    "eval_stop_ms": int,
}


def build_summary(
    attempts: Sequence[Sequence[AttemptResult]],
    *,
    attempts_per_instance: int,
    checkpoint_step: int,
    checkpoint_timestamp_ms: int,
    samples_count: int,
    target_accuracy: float,
    eval_start_ms: int,
    eval_stop_ms: int,
    instances: int = recipe.EVAL_SAMPLES,
    fatal_error: str | None = None,
) -> EvalSummary:
    """Summarise per-instance attempts; instances or attempts not given count as missing.

    pass@k uses n = `attempts_per_instance` (expected) and c = resolved attempts, so an error
    or a missing attempt is a failure, never a silent shrink of the denominator.
    """
    if attempts_per_instance < recipe.PASS_K:
        raise ValueError(
            f"attempts_per_instance must be >= {recipe.PASS_K} for pass@{recipe.PASS_K}"
        )
    if len(attempts) > instances:
        raise ValueError(f"{len(attempts)} instances given, {instances} expected")
    counts = {s: 0 for s in ATTEMPT_STATUSES}
    per_instance: list[tuple[int, int]] = []
    rewards: list[float] = []
    for i in range(instances):
        recorded = list(attempts[i]) if i < len(attempts) else []
        if len(recorded) > attempts_per_instance:
            raise ValueError(
                f"instance {i}: {len(recorded)} attempts, {attempts_per_instance} expected"
            )
        for a in recorded:
            counts[a.status] += 1
            if a.status != "error":
                rewards.append(a.reward)
        counts["missing"] += attempts_per_instance - len(recorded)
        per_instance.append((attempts_per_instance, sum(a.status == "resolved" for a in recorded)))
    expected = instances * attempts_per_instance
    pass_at = {str(k): mean_pass_at_k(per_instance, k) for k in PASS_KS}
    avg_at = {str(recipe.PASS_K): sum(c / n for n, c in per_instance) / instances}
    complete = counts["missing"] == 0
    reached = complete and fatal_error is None and pass_at[str(recipe.PASS_K)] > target_accuracy
    return EvalSummary(
        instances=instances,
        attempts_per_instance=attempts_per_instance,
        expected_attempts=expected,
        completed_attempts=counts["resolved"] + counts["failed"],
        missing_attempts=counts["missing"],
        error_attempts=counts["error"],
        resolved_attempts=counts["resolved"],
        avg_at_k=avg_at,
        pass_at_k=pass_at,
        mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
        status_counts=counts,
        complete=complete,
        fatal_error=fatal_error,
        target_accuracy=target_accuracy,
        target_reached=reached,
        checkpoint_step=checkpoint_step,
        checkpoint_timestamp_ms=checkpoint_timestamp_ms,
        samples_count=samples_count,
        eval_start_ms=eval_start_ms,
        eval_stop_ms=eval_stop_ms,
    )


def summary_problems(summary: EvalSummary, row: ManifestRow) -> list[str]:
    """Why `summary` cannot stand for `row`'s checkpoint; empty when it is valid."""
    problems = []
    if not summary.complete:
        problems.append(f"incomplete ({summary.missing_attempts} missing attempts)")
    if summary.fatal_error is not None:
        problems.append(f"fatal error: {summary.fatal_error}")
    if summary.error_attempts >= summary.expected_attempts:
        problems.append(f"all {summary.expected_attempts} attempts errored")
    if summary.instances != recipe.EVAL_SAMPLES:
        problems.append(f"{summary.instances} instances, the benchmark needs {recipe.EVAL_SAMPLES}")
    for name, got, want in (
        ("checkpoint_step", summary.checkpoint_step, row.step),
        ("checkpoint_timestamp_ms", summary.checkpoint_timestamp_ms, row.timestamp_ms),
        ("samples_count", summary.samples_count, row.samples_count),
    ):
        if got != want:
            problems.append(f"{name} {got} != manifest's {want} (a summary of another checkpoint)")
    if summary.eval_stop_ms < summary.eval_start_ms:
        problems.append("eval_stop_ms is before eval_start_ms")
    return problems


def read_summary(path: str) -> EvalSummary:
    try:
        text = jsonio.decode_utf8(storage_for(path).read_bytes(path), path)
    except jsonio.JSONInputError as e:
        raise SummaryError(str(e)) from e
    except (IsADirectoryError, NotADirectoryError) as e:
        raise SummaryError(f"{path}: {e.strerror}") from e
    return EvalSummary.from_json(text, where=path)


def write_summary(path: str, summary: EvalSummary) -> None:
    storage_for(path).write_atomic(path, summary.to_json().encode())
