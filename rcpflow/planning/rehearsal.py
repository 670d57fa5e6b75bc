"""What a rehearsal runs on: a job profile (how long a step and an evaluation take, on how many
chips) and a pass@4 curve per seed. Pure parsing, shared by the rehearsal jobs
(`tpu_jobs.rehearsal`), ``rcpflow forecast`` and the bench.

A profile is a TOML file of four keys::

    step_seconds = 185.0     # one training step: update and checkpoint save
    eval_seconds = 1700.0    # one evaluation of a checkpoint (251 tasks x 4 attempts)
    train_chips = 128
    eval_chips = 64          # chips of one evaluation (all its workers)

A curve is a CSV file: ``#`` lines are comments, then a header ``step,seed_<a>,seed_<b>,...`` and
one row per step from 1 up, each value the pass@4 a checkpoint of that step scores, in [0, 1].
A checkpoint solves `solved_tasks` of the 251 (the value rounded to a whole task), so its
pass@4 is exactly ``solved / 251``. Bad input is `RehearsalInputError`, naming the file and the
key, line or column.
"""

from __future__ import annotations

import csv
import io
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rcpflow import recipe
from rcpflow.files.storage import storage_for

_PROFILE_KEYS = ("step_seconds", "eval_seconds", "train_chips", "eval_chips")


class RehearsalInputError(ValueError):
    """A profile or curve that cannot be used; the message names the file and where."""


@dataclass(frozen=True)
class JobProfile:
    """How long the jobs of a run take, and on how many chips."""

    step_seconds: float
    eval_seconds: float
    train_chips: int
    eval_chips: int

    def __post_init__(self) -> None:
        for key in ("step_seconds", "eval_seconds"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                raise RehearsalInputError(f"{key} {value!r} must be a positive number of seconds")
        for key in ("train_chips", "eval_chips"):
            if getattr(self, key) < 1:
                raise RehearsalInputError(f"{key} {getattr(self, key)!r} must be at least 1")


def parse_profile(text: str, where: str) -> JobProfile:
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RehearsalInputError(f"{where}: not TOML: {e}") from e
    unknown = sorted(set(table) - set(_PROFILE_KEYS))
    if unknown:
        raise RehearsalInputError(
            f"{where}: unknown key {unknown[0]!r} (a profile has {', '.join(_PROFILE_KEYS)})"
        )
    for key in _PROFILE_KEYS:
        if key not in table:
            raise RehearsalInputError(f"{where}: {key} is missing")
        value = table[key]
        chips = key.endswith("_chips")
        kinds: tuple[type, ...] = (int,) if chips else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            what = "an integer" if chips else "a number"
            raise RehearsalInputError(f"{where}: {key} {value!r} is not {what}")
    try:
        return JobProfile(
            step_seconds=float(table["step_seconds"]),
            eval_seconds=float(table["eval_seconds"]),
            train_chips=table["train_chips"],
            eval_chips=table["eval_chips"],
        )
    except RehearsalInputError as e:
        raise RehearsalInputError(f"{where}: {e}") from e


def load_profile(path: str) -> JobProfile:
    return parse_profile(_read_text(path), path)


def solved_tasks(pass_at_4: float) -> int:
    """How many of the 251 tasks a checkpoint of this pass@4 solves (half a task rounds up)."""
    return math.floor(pass_at_4 * recipe.EVAL_SAMPLES + 0.5)


@dataclass(frozen=True)
class PassCurve:
    """pass@4 by step (1..`steps`), per seed."""

    source: str
    values: Mapping[int, tuple[float, ...]]  # seed -> value of step 1, 2, ...

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(sorted(self.values))

    @property
    def steps(self) -> int:
        return len(next(iter(self.values.values())))

    def pass_at_4(self, seed: int, step: int) -> float:
        """The pass@4 a checkpoint of `step` scores, as evaluated: `solved_tasks` / 251."""
        return self.solved(seed, step) / recipe.EVAL_SAMPLES

    def solved(self, seed: int, step: int) -> int:
        if seed not in self.values:
            raise RehearsalInputError(
                f"{self.source}: no seed {seed} (its seeds: {', '.join(map(str, self.seeds))})"
            )
        if not 1 <= step <= self.steps:
            raise RehearsalInputError(f"{self.source}: no step {step} (steps 1..{self.steps})")
        return solved_tasks(self.values[seed][step - 1])

    def first_pass(
        self, seed: int, val_start_at: int, max_steps: int, target: float = recipe.TARGET_ACCURACY
    ) -> int | None:
        """The first evaluated step (val_start_at..max_steps) strictly above `target`."""
        for step in range(val_start_at, max_steps + 1):
            if self.pass_at_4(seed, step) > target:
                return step
        return None


def parse_curve(text: str, where: str) -> PassCurve:
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if not line.startswith("#")]
    lines = [(n, line) for n, line in lines if line.strip()]
    if not lines:
        raise RehearsalInputError(f"{where}: no header line step,seed_<n>,...")
    rows = list(csv.reader(io.StringIO("\n".join(line for _, line in lines))))
    numbers = [n for n, _ in lines]
    header = [cell.strip() for cell in rows[0]]
    if header[:1] != ["step"] or len(header) < 2:
        raise RehearsalInputError(f"{where}: line {numbers[0]}: header must be step,seed_<n>,...")
    seeds: list[int] = []
    for name in header[1:]:
        digits = name.removeprefix("seed_")
        if not name.startswith("seed_") or not digits.isdigit():
            raise RehearsalInputError(
                f"{where}: line {numbers[0]}: column {name!r} is not seed_<n>"
            )
        if int(digits) in seeds:
            raise RehearsalInputError(f"{where}: line {numbers[0]}: column {name!r} twice")
        seeds.append(int(digits))
    columns: list[list[float]] = [[] for _ in seeds]
    for number, row in zip(numbers[1:], rows[1:], strict=True):
        if len(row) != len(header):
            raise RehearsalInputError(
                f"{where}: line {number}: {len(row)} values, the header has {len(header)}"
            )
        step = row[0].strip()
        want = len(columns[0]) + 1
        if step != str(want):
            raise RehearsalInputError(f"{where}: line {number}: step {step!r}, expected {want}")
        for seed, column, cell in zip(seeds, columns, row[1:], strict=True):
            try:
                value = float(cell)
            except ValueError:
                value = math.nan
            if not 0.0 <= value <= 1.0:
                raise RehearsalInputError(
                    f"{where}: line {number}: seed_{seed} {cell.strip()!r} is not a pass@4 "
                    "in [0, 1]"
                )
            column.append(value)
    if not columns[0]:
        raise RehearsalInputError(f"{where}: no steps after the header")
    values = {seed: tuple(column) for seed, column in zip(seeds, columns, strict=True)}
    return PassCurve(source=where, values=MappingProxyType(values))


def load_curve(path: str) -> PassCurve:
    return parse_curve(_read_text(path), path)


def _read_text(path: str) -> str:
    data = storage_for(path).read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RehearsalInputError(f"{path}: not UTF-8 text (byte {e.start})") from e
