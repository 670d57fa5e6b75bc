"""The result of evaluating one checkpoint: ``eval/step_<n>/summary.json``, and what makes it valid.

The format is Tunix's DeepSWE evaluation summary (same field names and JSON types: `avg_at_k` a
float, `pass_at_k` ``{"1", "4"}``, `status_counts` of the completed attempts, ...) plus rcpflow's
eval wall clock, `eval_start_ms` and `eval_stop_ms`. A summary of another program may lack the two
times (the importer then takes them from flags) and may carry fields rcpflow does not use (Tunix's
`rcp_logged`, or whatever a later version adds): those are accepted and dropped, as Tunix's own
readers do; a field rcpflow uses with the wrong JSON type is an error naming it.

Nothing a summary says about itself is trusted. `consistency_problems` checks it against itself
and the benchmark (251 instances x 4 attempts, counts that add up, pass@k that the counts can
give), `row_problems` against the manifest row of its checkpoint; `summary_problems` is both plus
completeness. `target_reached` is written for readers but never read back: the gate decides with
``pass@4 > target`` (the checker's rule; Tunix's own flag used ``>=``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rcpflow import jsonio, recipe
from rcpflow.manifest import ManifestRow
from rcpflow.passk import mean_pass_at_k
from rcpflow.storage import storage_for

ATTEMPT_OUTCOMES = ("resolved", "failed", "error")
PASS_KS = (1, recipe.PASS_K)
# Tolerance of float equalities (pass@1 = resolved/expected, pass@k recomputed): far below the
# 1/1004 resolution of the counts, far above the rounding of a sum over 251 tasks.
FLOAT_TOLERANCE = 1e-9
TIME_FIELDS = ("eval_start_ms", "eval_stop_ms")


class SummaryError(ValueError):
    """A file that cannot be read as a summary; the message names the file and field."""


@dataclass(frozen=True)
class Problem:
    """One reason a summary is not valid, naming the field(s) at fault."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True)
class AttemptResult:
    """One attempt at one instance: resolved (reward 1) or failed, or error (no answer).

    `label` is the evaluator's own status word (e.g. Tunix's ``MAX_CONTEXT_LIMIT_REACHED``),
    counted in `status_counts`; without one the outcome itself is counted.
    """

    status: str
    reward: float = 0.0
    label: str | None = None

    def __post_init__(self) -> None:
        if self.status not in ATTEMPT_OUTCOMES:
            raise ValueError(
                f"attempt status must be resolved, failed or error, got {self.status!r}"
            )

    @property
    def status_label(self) -> str:
        return self.status if self.label is None else self.label


@dataclass(frozen=True)
class EvalSummary:
    instances: int
    attempts_per_instance: int
    expected_attempts: int
    completed_attempts: int  # resolved + failed + error: every attempt that ran
    missing_attempts: int
    error_attempts: int  # completed attempts that gave no answer
    resolved_attempts: int
    avg_at_k: float  # mean per-attempt success rate
    pass_at_k: dict[str, float]
    mean_reward: float
    status_counts: dict[str, int]  # over completed attempts
    complete: bool
    fatal_error: str | None
    target_accuracy: float
    target_reached: bool  # written for readers, never trusted
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
    def from_dict(
        cls, d: Any, where: str, eval_times: tuple[int, int] | None = None
    ) -> EvalSummary:
        """Read the fields rcpflow uses, type-checked; others are ignored.

        `eval_times` (start, stop) replace the summary's own, or stand in for them when it has
        none (Tunix's summaries carry no wall clock); with neither, the summary is refused.
        """
        if not isinstance(d, dict):
            raise SummaryError(f"{where}: a summary must be a JSON object")
        needed = [n for n in _FIELD_TYPES if n not in TIME_FIELDS or eval_times is None]
        missing = sorted(n for n in needed if n not in d)
        if missing:
            raise SummaryError(f"{where}: missing field(s) {', '.join(missing)}")
        values: dict[str, Any] = {}
        for name, expected in _FIELD_TYPES.items():
            if name in TIME_FIELDS and eval_times is not None:
                continue
            value = d[name]
            if not _is(value, expected):
                raise SummaryError(f"{where}: field {name} has the wrong type: {value!r}")
            values[name] = _canonical(value, expected)
        if eval_times is not None:
            values["eval_start_ms"], values["eval_stop_ms"] = eval_times
        return cls(**values)

    @classmethod
    def from_json(
        cls, text: str, where: str, eval_times: tuple[int, int] | None = None
    ) -> EvalSummary:
        try:
            d = jsonio.loads(text, where)  # duplicate keys, NaN, too deep: invalid
        except jsonio.JSONInputError as e:
            raise SummaryError(str(e)) from e
        return cls.from_dict(d, where, eval_times)


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


def _canonical(value: Any, expected: Any) -> Any:
    """Floats written as JSON integers (``1``) become floats, so a re-write gives the same bytes."""
    if expected is float:
        return float(value)
    if expected == "dict[float]":
        return {k: float(v) for k, v in value.items()}
    if isinstance(value, dict):
        return dict(value)
    return value


_FIELD_TYPES: dict[str, Any] = {
    "instances": int,
    "attempts_per_instance": int,
    "expected_attempts": int,
    "completed_attempts": int,
    "missing_attempts": int,
    "error_attempts": int,
    "resolved_attempts": int,
    "avg_at_k": float,
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
COUNT_FIELDS = (
    "instances",
    "attempts_per_instance",
    "expected_attempts",
    "completed_attempts",
    "missing_attempts",
    "error_attempts",
    "resolved_attempts",
)


def task_counts(
    attempts: Sequence[Sequence[AttemptResult]], attempts_per_instance: int, instances: int
) -> list[tuple[int, int]]:
    """(n expected, c resolved) per task: absent tasks and attempts are failures, never a
    smaller denominator."""
    return [
        (attempts_per_instance, sum(a.status == "resolved" for a in attempts[i]))
        if i < len(attempts)
        else (attempts_per_instance, 0)
        for i in range(instances)
    ]


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
    labels: dict[str, int] = {}
    outcomes = dict.fromkeys(ATTEMPT_OUTCOMES, 0)
    rewards: list[float] = []
    for i, recorded in enumerate(attempts):
        if len(recorded) > attempts_per_instance:
            raise ValueError(
                f"instance {i}: {len(recorded)} attempts, {attempts_per_instance} expected"
            )
        for a in recorded:
            outcomes[a.status] += 1
            labels[a.status_label] = labels.get(a.status_label, 0) + 1
            if a.status != "error":
                rewards.append(a.reward)
    expected = instances * attempts_per_instance
    completed = sum(outcomes.values())
    per_task = task_counts(attempts, attempts_per_instance, instances)
    pass_at = {str(k): mean_pass_at_k(per_task, k) for k in PASS_KS}
    complete = completed == expected
    reached = complete and fatal_error is None and pass_at[str(recipe.PASS_K)] > target_accuracy
    return EvalSummary(
        instances=instances,
        attempts_per_instance=attempts_per_instance,
        expected_attempts=expected,
        completed_attempts=completed,
        missing_attempts=expected - completed,
        error_attempts=outcomes["error"],
        resolved_attempts=outcomes["resolved"],
        avg_at_k=outcomes["resolved"] / expected,
        pass_at_k=pass_at,
        mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
        status_counts=dict(sorted(labels.items())),
        complete=complete,
        fatal_error=fatal_error,
        target_accuracy=float(target_accuracy),
        target_reached=reached,
        checkpoint_step=checkpoint_step,
        checkpoint_timestamp_ms=checkpoint_timestamp_ms,
        samples_count=samples_count,
        eval_start_ms=eval_start_ms,
        eval_stop_ms=eval_stop_ms,
    )


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
    elif s.complete and s.expected_attempts > 0:
        rate = s.resolved_attempts / s.expected_attempts
        if not _close(s.avg_at_k, rate):
            out.append(Problem("avg_at_k", f"{s.avg_at_k} != resolved/expected attempts = {rate}"))
    if not 0.0 <= s.target_accuracy <= 1.0:
        out.append(Problem("target_accuracy", f"{s.target_accuracy} is not in [0, 1]"))
    if s.eval_stop_ms < s.eval_start_ms:
        out.append(
            Problem("eval_stop_ms", f"{s.eval_stop_ms} is before eval_start_ms {s.eval_start_ms}")
        )
    return out


def _pass_at_k_problems(s: EvalSummary) -> list[Problem]:
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


def recomputed_problems(
    s: EvalSummary, attempts: Sequence[Sequence[AttemptResult]], where: str
) -> list[Problem]:
    """`s`'s pass@k against the attempts it claims to summarise (`where` names that file)."""
    if len(attempts) > s.instances or s.attempts_per_instance < recipe.PASS_K:
        return [
            Problem("instances", f"{len(attempts)} tasks in {where}, summary says {s.instances}")
        ]
    per_task = task_counts(attempts, s.attempts_per_instance, s.instances)
    out: list[Problem] = []
    for key, value in sorted(s.pass_at_k.items()):
        if not key.isdigit() or not 1 <= int(key) <= s.attempts_per_instance:
            continue  # already named by consistency_problems
        again = mean_pass_at_k(per_task, int(key))
        if not _close(value, again):
            out.append(Problem(f'pass_at_k["{key}"]', f"{value} but {where} gives {again}"))
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
    if not _close(s.target_accuracy, row.target_accuracy):
        out.append(
            Problem("target_accuracy", f"{s.target_accuracy} != manifest's {row.target_accuracy}")
        )
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


def summary_problems(summary: EvalSummary, row: ManifestRow) -> list[str]:
    """Why `summary` cannot stand for `row`'s checkpoint, one line per problem; empty if valid."""
    return [str(p) for p in validity_problems(summary, row)]


def read_summary(path: str, eval_times: tuple[int, int] | None = None) -> EvalSummary:
    try:
        text = jsonio.decode_utf8(storage_for(path).read_bytes(path), path)
    except jsonio.JSONInputError as e:
        raise SummaryError(str(e)) from e
    except (IsADirectoryError, NotADirectoryError) as e:
        raise SummaryError(f"{path}: {e.strerror}") from e
    return EvalSummary.from_json(text, where=path, eval_times=eval_times)


def write_summary(path: str, summary: EvalSummary) -> None:
    storage_for(path).write_atomic(path, summary.to_json().encode())
