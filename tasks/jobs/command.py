"""The job commands, the same on every backend: an argv template per role, filled per run.

A `JobCommand` is data: an argument list whose items may hold ``{placeholder}`` fields. Each
item is filled on its own and stays one argument (no shell, no splitting), so a value a user
typed into a Param is never interpreted. Only the placeholders of the command's role exist;
``{python}`` is the interpreter, which the backend supplies (the worker's venv locally, the
image's ``python`` on GKE).
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Role = Literal["train", "evaluate"]
ROLES: tuple[Role, ...] = ("train", "evaluate")

# What each role's command may refer to.
PLACEHOLDERS: Mapping[Role, frozenset[str]] = {
    "train": frozenset(
        {
            "python",
            "run_dir",
            "seed",
            "global_batch_size",
            "max_steps",
            "val_start_at",  # the effective one: the recipe's unless the run overrides it
            "division",
            "checkpoint_dir",  # <run_dir>/checkpoints, where rcpflow's own layout keeps them
        }
    ),
    "evaluate": frozenset(
        {
            "python",
            "run_dir",
            "step",
            "seed",
            "samples_count",
            "checkpoint_path",  # the manifest row's, absolute
            "checkpoint_timestamp_ms",
            "summary_dir",  # <run_dir>/eval/step_<step>, where rcpflow keeps the step's result
        }
    ),
}


class JobCommandError(ValueError):
    """A command template is malformed or a value is missing; the message names the item.

    `index` is the argv item at fault (None when the error is not about one item)."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


@dataclass(frozen=True)
class JobCommand:
    """`argv` of one role's job; ``{name}`` in an item is replaced by that value, ``{{``/``}}``
    are literal braces."""

    role: Role
    argv: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.argv:
            raise JobCommandError(f"{self.role} command: argv is empty")
        for i, item in enumerate(self.argv):
            try:
                check_template(self.role, item)
            except JobCommandError as exc:
                raise JobCommandError(f"{self.role} command argv[{i}] {exc}", index=i) from None

    @property
    def placeholders(self) -> frozenset[str]:
        return frozenset(n for item in self.argv for n in _fields(item))

    def render(self, values: Mapping[str, str | int]) -> list[str]:
        """The argv with every placeholder filled from `values` (extra values are ignored)."""
        missing = sorted(self.placeholders - set(values))
        if missing:
            raise JobCommandError(f"{self.role} command: no value for {', '.join(missing)}")
        return [fill(item, values) for item in self.argv]


def check_template(role: Role, item: str, known: frozenset[str] | None = None) -> frozenset[str]:
    """The placeholders of the template `item`, each one a `role` job has (or one of `known`);
    otherwise JobCommandError naming the item and what such a job may use."""
    allowed = PLACEHOLDERS[role] if known is None else known
    names = _fields(item)
    for name in names:
        if name in allowed:
            continue
        others = [r for r in ROLES if r != role and name in PLACEHOLDERS[r]]
        if name in PLACEHOLDERS[role]:
            why = f"{{{name}}} has no value here"
        elif others:
            why = f"{{{name}}} is a placeholder of {' and '.join(others)} jobs, not of {role} jobs"
        else:
            why = f"unknown placeholder {{{name}}}"
        raise JobCommandError(f"{item!r}: {why} (known: {', '.join(sorted(allowed))})")
    return frozenset(names)


def fill(item: str, values: Mapping[str, str | int]) -> str:
    """`item` with its placeholders replaced by `values` (each must be there)."""
    parts = []
    for literal, name, _spec, _conversion in string.Formatter().parse(item):
        parts.append(literal)
        if name is not None:
            parts.append(str(values[name]))
    return "".join(parts)


def _fields(item: str) -> list[str]:
    try:
        parsed = list(string.Formatter().parse(item))
    except ValueError as exc:
        raise JobCommandError(f"{item!r}: {exc}") from exc
    names = []
    for _literal, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise JobCommandError(
                f"{item!r}: a placeholder is a bare {{name}}, got {{{name}"
                f"{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}"
            )
        names.append(name)
    return names


# The toy GRPO jobs of this repository (tpu_jobs), as every backend runs them by default.
TRAIN_JOB = JobCommand(
    "train",
    (
        "{python}",
        "-m",
        "tpu_jobs.train",
        "--run-dir",
        "{run_dir}",
        "--seed",
        "{seed}",
        "--global-batch-size",
        "{global_batch_size}",
        "--max-steps",
        "{max_steps}",
        "--val-start-at",
        "{val_start_at}",
        "--division",
        "{division}",
    ),
)
EVALUATE_JOB = JobCommand(
    "evaluate",
    ("{python}", "-m", "tpu_jobs.evaluate", "--run-dir", "{run_dir}", "--step", "{step}"),
)
