"""Per-attempt evaluation records, in the formats evaluators write, as attempts per task.

Formats (one JSON object a line, told apart by their fields or named by the caller): ``rcpflow``
(`instance`, `attempt`, `status`, `reward`), ``deepswe`` (Tunix's DeepSWE trajectory records),
``r2egym`` (R2E-Gym trajectories). Infrastructure failures are not counted; a record that
contradicts itself, or a counted attempt twice, is an error naming the line. Tasks map onto the
benchmark's 251 (docs/design.md, verification of foreign inputs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rcpflow import recipe
from rcpflow.files import jsonio
from rcpflow.records.summary import AttemptResult

AttemptFormat = Literal["rcpflow", "deepswe", "r2egym"]
ATTEMPT_FORMATS: tuple[AttemptFormat, ...] = ("rcpflow", "deepswe", "r2egym")
DEEPSWE_SCHEMA = "canon.p46.deepswe-eval.trajectory.v4"
# Tunix's completed model outcomes, solved or not; anything else is an infrastructure failure.
DEEPSWE_VALID_STATUSES = frozenset(
    {"SUCCEEDED", "MAX_STEPS_REACHED", "MAX_CONTEXT_LIMIT_REACHED", "MODEL_TIMEOUT", "TIMEOUT"}
)
R2EGYM_INFRA_FAILURE = "env_exception"
RCPFLOW_STATUSES = ("resolved", "failed", "error")
REWARD_BOUND = 1.0


class AttemptsError(ValueError):
    """Records that cannot be counted; the message names the file and line (or task)."""


@dataclass(frozen=True)
class TaskAttempts:
    task: str
    attempts: tuple[AttemptResult, ...]


@dataclass(frozen=True)
class AttemptSet:
    """The counted attempts of one evaluation, per task, sorted by task."""

    format: AttemptFormat
    tasks: tuple[TaskAttempts, ...]
    # Records that were not counted: infrastructure failures the evaluator retried.
    not_counted: int

    def per_instance(self) -> list[list[AttemptResult]]:
        return [list(t.attempts) for t in self.tasks]

    @property
    def short_tasks(self) -> tuple[str, ...]:
        """Tasks with fewer counted attempts than the benchmark needs."""
        need = recipe.EVAL_ATTEMPTS_PER_INSTANCE
        return tuple(t.task for t in self.tasks if len(t.attempts) < need)


def detect_format(record: Mapping[str, Any]) -> AttemptFormat | None:
    if "schema" in record:
        return "deepswe"
    if "docker_image" in record and "exit_reason" in record:
        return "r2egym"
    if {"instance", "attempt", "status"} <= set(record):
        return "rcpflow"
    return None


def _number(record: Mapping[str, Any], key: str, where: str) -> float:
    """A reward: a finite number in [-1, 1] (the formats' rewards are 0 or 1; a sum of them
    must stay finite)."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AttemptsError(f"{where}: {key} must be a number, got {value!r}")
    if not math.isfinite(value) or not -REWARD_BOUND <= value <= REWARD_BOUND:
        raise AttemptsError(
            f"{where}: {key} {value!r} is not a finite number in [-{REWARD_BOUND}, {REWARD_BOUND}]"
        )
    return float(value)


def _int(record: Mapping[str, Any], key: str, where: str, limit: int) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise AttemptsError(f"{where}: {key} must be an integer in 0..{limit - 1}, got {value!r}")
    return value


def _str(record: Mapping[str, Any], key: str, where: str) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value:
        raise AttemptsError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value


# A reader turns one record into (task, slot, attempt), or None when it is not counted. A slot
# (the attempt's index) may occur once per task; None: the format numbers no attempts.
Counted = tuple[str, object | None, AttemptResult] | None


def _rcpflow(record: Mapping[str, Any], where: str) -> Counted:
    instance = _int(record, "instance", where, recipe.EVAL_SAMPLES)
    attempt = _int(record, "attempt", where, recipe.EVAL_ATTEMPTS_PER_INSTANCE)
    status = record.get("status")
    if status not in RCPFLOW_STATUSES:
        raise AttemptsError(f"{where}: status {status!r} is not one of {RCPFLOW_STATUSES}")
    reward = _number(record, "reward", where)
    if (status == "resolved") != (reward == 1.0) and status != "error":
        raise AttemptsError(f"{where}: status {status} does not match reward {reward}")
    return f"{instance:03d}", attempt, AttemptResult(status, reward)


def _deepswe(record: Mapping[str, Any], where: str) -> Counted:
    if record.get("schema") != DEEPSWE_SCHEMA:
        raise AttemptsError(f"{where}: schema {record.get('schema')!r} is not {DEEPSWE_SCHEMA}")
    task = _str(record, "task_key", where)
    if record.get("docker_image") != task:
        raise AttemptsError(
            f"{where}: task_key {task!r} != docker_image {record.get('docker_image')!r}"
        )
    sample = _int(record, "sample_index", where, recipe.EVAL_ATTEMPTS_PER_INSTANCE)
    valid, solved = record.get("valid"), record.get("solved")
    if not isinstance(valid, bool) or not isinstance(solved, bool):
        raise AttemptsError(f"{where}: valid and solved must be booleans")
    status = _str(record, "status", where)
    reward = _number(record, "reward", where)
    if solved != (valid and reward == 1.0):
        raise AttemptsError(
            f"{where}: solved {solved} but valid {valid} and reward {reward} (solved means "
            "valid and reward 1.0)"
        )
    if not valid:
        return None
    if status not in DEEPSWE_VALID_STATUSES:
        raise AttemptsError(
            f"{where}: valid record with status {status!r}, not a model outcome "
            f"({', '.join(sorted(DEEPSWE_VALID_STATUSES))})"
        )
    return task, sample, AttemptResult("resolved" if solved else "failed", reward, label=status)


def _r2egym(record: Mapping[str, Any], where: str) -> Counted:
    task = _str(record, "docker_image", where)
    reason = _str(record, "exit_reason", where)
    reward = _number(record, "reward", where)
    if reason == R2EGYM_INFRA_FAILURE:
        return None
    outcome = "resolved" if reward == 1.0 else "failed"
    return task, None, AttemptResult(outcome, reward, label=reason)


_READERS: dict[AttemptFormat, Callable[[Mapping[str, Any], str], Counted]] = {
    "rcpflow": _rcpflow,
    "deepswe": _deepswe,
    "r2egym": _r2egym,
}


def parse_attempts(text: str, where: str, fmt: AttemptFormat | None = None) -> AttemptSet:
    """The counted attempts of `text`; the format is detected from the first record unless
    given, and every record must be of that format."""
    per_task: dict[str, list[AttemptResult]] = {}
    slots: set[tuple[str, object]] = set()
    not_counted = 0
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        at = f"{where}: line {line_no}"
        try:
            # Strict (duplicate keys, 64-bit integers), but foreign records may hold NaN in
            # fields rcpflow does not use: the numbers it uses are checked finite (`_number`).
            record = jsonio.loads(line, where, first_line=line_no, allow_nan=True)
        except jsonio.JSONInputError as e:
            raise AttemptsError(str(e)) from e
        if not isinstance(record, dict):
            raise AttemptsError(f"{at}: a record must be a JSON object")
        found = detect_format(record)
        if fmt is None:
            if found is None:
                raise AttemptsError(f"{at}: not an attempt record of {', '.join(ATTEMPT_FORMATS)}")
            fmt = found
        elif found is not None and found != fmt:
            raise AttemptsError(f"{at}: not a {fmt} record ({found} format)")
        try:
            counted = _READERS[fmt](record, at)
        except AttemptsError as e:  # the reader names the field; say which format it read
            raise AttemptsError(f"{e} (not a valid {fmt} record)") from e
        if counted is None:
            not_counted += 1
            continue
        task, slot, attempt = counted
        if slot is not None:
            if (task, slot) in slots:
                raise AttemptsError(f"{at}: task {task} attempt {slot} is counted twice")
            slots.add((task, slot))
        per_task.setdefault(task, []).append(attempt)
    if fmt is None:
        raise AttemptsError(f"{where}: no attempt records")
    for task, attempts in per_task.items():
        if len(attempts) > recipe.EVAL_ATTEMPTS_PER_INSTANCE:
            raise AttemptsError(
                f"{where}: task {task}: {len(attempts)} counted attempts, "
                f"{recipe.EVAL_ATTEMPTS_PER_INSTANCE} expected"
            )
    if len(per_task) > recipe.EVAL_SAMPLES:
        raise AttemptsError(
            f"{where}: {len(per_task)} tasks, the benchmark evaluates {recipe.EVAL_SAMPLES}"
        )
    tasks = tuple(TaskAttempts(t, tuple(per_task[t])) for t in sorted(per_task))
    return AttemptSet(format=fmt, tasks=tasks, not_counted=not_counted)
