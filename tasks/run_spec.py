"""What one run (one seed) is asked to do: the Params of ``mlperf_grpo_run`` and their checks.

The JSON schema on each Param lets the UI form and REST ``conf`` refuse malformed input before a
run is created; `run_spec` repeats the checks a schema cannot express (across fields, paths) in
the run's first task, so a bad request fails before anything is trained, naming the Param.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow.sdk import Param, get_current_context, task

from rcpflow import recipe

log = logging.getLogger(__name__)


class ParamError(ValueError):
    """A Param (or a combination of Params) is refused; the message names the Param."""


@dataclass(frozen=True)
class RunSpec:
    run_dir: str
    seed: int
    global_batch_size: int
    max_steps: int
    val_start_at: int | None  # the override; None = the recipe's ceil(2.5 + 3840/gbs)
    division: str

    @property
    def effective_val_start_at(self) -> int:
        return recipe.val_start_at(self.global_batch_size, self.val_start_at)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def train_args(self) -> list[str]:
        from tasks.local_jobs import train_args

        return train_args(
            run_dir=self.run_dir,
            seed=self.seed,
            global_batch_size=self.global_batch_size,
            max_steps=self.max_steps,
            val_start_at=self.val_start_at,
            division=self.division,
        )


def training_params(*, max_steps: int = 60) -> dict[str, Param]:
    """The Params that shape training, shared by the run and submission DAGs (fresh objects:
    Param instances must not be shared between DAGs)."""
    return {
        "global_batch_size": Param(
            256,
            type="integer",
            minimum=recipe.GENERATIONS_PER_PROMPT,
            multipleOf=recipe.GENERATIONS_PER_PROMPT,
            title="Global batch size",
            description="Prompts x 16 generations per step.",
        ),
        "max_steps": Param(max_steps, type="integer", minimum=1, title="Max steps"),
        "val_start_at": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Validation start override",
            description="Empty: ceil(2.5 + 3840 / global_batch_size).",
        ),
        "division": Param("closed", type="string", enum=list(recipe.DIVISIONS), title="Division"),
    }


def run_params(*, max_steps: int = 60) -> dict[str, Param]:
    """The Params of mlperf_grpo_run."""
    return {
        "run_dir": Param(
            type="string",
            minLength=1,
            title="Run folder",
            description="Absolute local path or gs://bucket/prefix; created if missing.",
        ),
        "seed": Param(1, type="integer", minimum=0, title="Seed"),
        **training_params(max_steps=max_steps),
    }


def check_path(name: str, value: Any) -> str:
    """An absolute local path or a gs:// URL (a relative path would depend on a worker's cwd)."""
    if not isinstance(value, str) or not value:
        raise ParamError(f"{name}: must be a non-empty string, got {value!r}")
    if value.startswith("gs://"):
        if len(value) <= len("gs://") or value[len("gs://")] == "/":
            raise ParamError(f"{name}: {value!r} names no bucket")
        return value.rstrip("/")
    if not os.path.isabs(value):
        raise ParamError(f"{name}: {value!r} must be an absolute path or gs://bucket/prefix")
    return os.path.normpath(value)


def _int(params: Mapping[str, Any], name: str, minimum: int) -> int:
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ParamError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return value


def run_spec(params: Mapping[str, Any]) -> RunSpec:
    """Validate the Params of one run; raises ParamError naming the Param."""
    gbs = _int(params, "global_batch_size", 1)
    try:
        recipe.check_global_batch_size(gbs)
    except ValueError as exc:
        raise ParamError(str(exc)) from exc
    max_steps = _int(params, "max_steps", 1)
    override = params["val_start_at"]
    if override is not None:
        override = _int(params, "val_start_at", 1)
    division = params["division"]
    if division not in recipe.DIVISIONS:
        raise ParamError(f"division: must be one of {recipe.DIVISIONS}, got {division!r}")
    spec = RunSpec(
        run_dir=check_path("run_dir", params["run_dir"]),
        seed=_int(params, "seed", 0),
        global_batch_size=gbs,
        max_steps=max_steps,
        val_start_at=override,
        division=division,
    )
    if spec.effective_val_start_at > max_steps:
        raise ParamError(
            f"val_start_at: validation would start at step {spec.effective_val_start_at}, after "
            f"max_steps {max_steps}, so no checkpoint would ever be evaluated"
        )
    return spec


@task(multiple_outputs=True)
def plan_run() -> dict[str, Any]:
    """First task of a run: the validated RunSpec (fails naming the Param, before any job)."""
    spec = run_spec(get_current_context()["params"])
    log.info("run spec: %s", spec)
    return spec.to_dict()
