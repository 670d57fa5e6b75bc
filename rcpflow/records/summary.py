"""The result of evaluating one checkpoint, ``eval/step_<n>/summary.json``: the model and its IO.

The format is Tunix's DeepSWE evaluation summary (same field names and JSON types) plus the eval
wall clock `eval_start_ms`/`eval_stop_ms`, which a foreign summary may lack (the caller then
gives them). Fields rcpflow does not use are accepted and dropped; a used field of the wrong JSON
type is a `SummaryError` naming it. Whether a summary is valid: `rcpflow.records.summary_checks`.
`target_reached` is written for readers, never read back (docs/design.md, the gate).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rcpflow import recipe
from rcpflow.files import jsonio
from rcpflow.files.storage import storage_for
from rcpflow.records.passk import mean_pass_at_k

ATTEMPT_OUTCOMES = ("resolved", "failed", "error")
PASS_KS = (1, recipe.PASS_K)
TIME_FIELDS = ("eval_start_ms", "eval_stop_ms")


class CheckpointRef(Protocol):
    """The checkpoint a summary is of, by the three numbers that name it (a manifest row is
    one; so is any record of the checkpoint that carries them)."""

    @property
    def step(self) -> int: ...
    @property
    def timestamp_ms(self) -> int: ...
    @property
    def samples_count(self) -> int: ...


class SummaryError(ValueError):
    """A file that cannot be read as a summary; the message names the file and field."""


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
    # False: an evaluator that kept no per-attempt records (NeMo-RL's deferred evaluator logs
    # only its accuracy): pass_at_k holds pass@4 alone, the attempt counts are not known (0,
    # status "not_recorded"), and pass@4 could not be recomputed. Written only when False.
    attempt_records: bool = True

    @property
    def eval_accuracy(self) -> float:
        return self.pass_at_k[str(recipe.PASS_K)]

    @property
    def validation_time_s(self) -> float:
        return (self.eval_stop_ms - self.eval_start_ms) / 1000.0

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        if self.attempt_records:
            del d["attempt_records"]  # the bytes of every summary that has records unchanged
        return json.dumps(d, sort_keys=True, indent=2) + "\n"

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
        records = d.get("attempt_records", True)
        if not isinstance(records, bool):
            raise SummaryError(f"{where}: field attempt_records has the wrong type: {records!r}")
        return cls(**values, attempt_records=records)

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


@dataclass(frozen=True)
class AttemptCounts:
    """What a set of attempts says by itself: the counts a summary states, its pass@k."""

    instances: int
    attempts_per_instance: int
    expected_attempts: int
    completed_attempts: int
    missing_attempts: int
    error_attempts: int
    resolved_attempts: int
    avg_at_k: float
    pass_at_k: dict[str, float]
    mean_reward: float
    status_counts: dict[str, int]


def count_attempts(
    attempts: Sequence[Sequence[AttemptResult]],
    attempts_per_instance: int = recipe.EVAL_ATTEMPTS_PER_INSTANCE,
    instances: int = recipe.EVAL_SAMPLES,
) -> AttemptCounts:
    """Count per-instance attempts; instances or attempts not given count as missing.

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
    return AttemptCounts(
        instances=instances,
        attempts_per_instance=attempts_per_instance,
        expected_attempts=expected,
        completed_attempts=completed,
        missing_attempts=expected - completed,
        error_attempts=outcomes["error"],
        resolved_attempts=outcomes["resolved"],
        avg_at_k=outcomes["resolved"] / expected,
        pass_at_k={str(k): mean_pass_at_k(per_task, k) for k in PASS_KS},
        mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
        status_counts=dict(sorted(labels.items())),
    )


def build_summary(
    attempts: Sequence[Sequence[AttemptResult]],
    *,
    checkpoint: CheckpointRef,
    target_accuracy: float,
    eval_start_ms: int,
    eval_stop_ms: int,
    attempts_per_instance: int = recipe.EVAL_ATTEMPTS_PER_INSTANCE,
    instances: int = recipe.EVAL_SAMPLES,
    fatal_error: str | None = None,
) -> EvalSummary:
    """The summary of `checkpoint`'s evaluation: `count_attempts`, and whether it reached the
    target (complete, no fatal error, pass@k above it)."""
    counts = count_attempts(attempts, attempts_per_instance, instances)
    complete = counts.completed_attempts == counts.expected_attempts
    pass_k = counts.pass_at_k[str(recipe.PASS_K)]
    return EvalSummary(
        **dataclasses.asdict(counts),
        complete=complete,
        fatal_error=fatal_error,
        target_accuracy=float(target_accuracy),
        target_reached=complete and fatal_error is None and pass_k > target_accuracy,
        checkpoint_step=checkpoint.step,
        checkpoint_timestamp_ms=checkpoint.timestamp_ms,
        samples_count=checkpoint.samples_count,
        eval_start_ms=eval_start_ms,
        eval_stop_ms=eval_stop_ms,
    )


NOT_RECORDED = "not_recorded"


def accuracy_only_summary(
    accuracy: float,
    *,
    checkpoint: CheckpointRef,
    eval_start_ms: int,
    eval_stop_ms: int,
    instances: int,
) -> EvalSummary:
    """The summary of an evaluator that logged only its pass@4 (no per-attempt records): its
    log's `instances` (``eval_samples``) x 4 attempts, none of them known (see
    `attempt_records`); complete only when those are the benchmark's 251 (another count is
    another evaluation set, which `consistency_problems` names)."""
    expected = instances * recipe.EVAL_ATTEMPTS_PER_INSTANCE
    complete = instances == recipe.EVAL_SAMPLES
    return EvalSummary(
        instances=instances,
        attempts_per_instance=recipe.EVAL_ATTEMPTS_PER_INSTANCE,
        expected_attempts=expected,
        completed_attempts=expected,
        missing_attempts=0,
        error_attempts=0,
        resolved_attempts=0,
        avg_at_k=0.0,
        pass_at_k={str(recipe.PASS_K): float(accuracy)},
        mean_reward=0.0,
        status_counts={NOT_RECORDED: expected},
        complete=complete,
        fatal_error=None,
        target_accuracy=recipe.TARGET_ACCURACY,
        target_reached=accuracy > recipe.TARGET_ACCURACY,
        checkpoint_step=checkpoint.step,
        checkpoint_timestamp_ms=checkpoint.timestamp_ms,
        samples_count=checkpoint.samples_count,
        eval_start_ms=eval_start_ms,
        eval_stop_ms=eval_stop_ms,
        attempt_records=False,
    )


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
