"""What one run (one seed) is asked to do: the Params of ``mlperf_grpo_run`` and their checks.

The Params' JSON schema refuses malformed input before a run is created; `run_spec` repeats
what a schema cannot express (across fields, paths) in the run's first task, ``plan``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow.sdk import Param, XComArg, get_current_context, task
from airflow.sdk.definitions.xcom_arg import PlainXComArg

from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.recipe import DIVISIONS, Division
from rcpflow.trainer.ownership import airflow_owner, lease_path, live_holder
from rcpflow.verdict.schedule import (
    DEFAULT_SCHEDULE,
    RULES_WORDING,
    SCHEDULES,
    closed_division_warning,
)
from rcpflow.verdict.schedule_record import ScheduleRecord, record_schedule
from tasks.backend_api.protocol import FormDefaults
from tasks.deployment import MAX_EVAL_WINDOW, Deployment, EvalSchedule, load_deployment
from tasks.names import PLAN_TASK_ID

log = logging.getLogger(__name__)

# A task parameter wired from another task's output: a JSON value from XCom at run time, the
# XComArg that resolves to it in a DAG body. The task parses it into a typed spec first thing.
XComValue = Any


class ParamError(ValueError):
    """A Param (or a combination of Params) is refused; the message names the Param."""


@dataclass(frozen=True)
class RunSpec:
    run_dir: str
    seed: int
    global_batch_size: int
    max_steps: int
    val_start_at: int | None  # the override; None = the recipe's ceil(2.5 + 3840/gbs)
    division: Division
    eval_schedule: EvalSchedule = DEFAULT_SCHEDULE
    eval_window: int = 1

    @classmethod
    def from_dict(cls, d: XComValue) -> RunSpec:
        return cls(**d)

    @property
    def schedule_record(self) -> ScheduleRecord:
        """`eval_schedule` and `eval_window` as the plan records them
        (`rcpflow.verdict.schedule_record`)."""
        return ScheduleRecord(eval_schedule=self.eval_schedule, eval_window=self.eval_window)

    @property
    def effective_val_start_at(self) -> int:
        return recipe.val_start_at(self.global_batch_size, self.val_start_at)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def job_values(self) -> dict[str, str | int]:
        """The placeholder values of the training command (tasks.jobs.command)."""
        return {
            "run_dir": self.run_dir,
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
            "max_steps": self.max_steps,
            "val_start_at": self.effective_val_start_at,
            "division": self.division,
        }


def training_params(defaults: FormDefaults) -> dict[str, Param]:
    """The Params that shape training, shared by the run and submission DAGs (fresh objects:
    Param instances must not be shared between DAGs)."""
    return {
        "global_batch_size": Param(
            recipe.REFERENCE_BATCH_SIZE,
            type="integer",
            minimum=recipe.GENERATIONS_PER_PROMPT,
            maximum=recipe.MAX_GLOBAL_BATCH_SIZE,
            multipleOf=recipe.GENERATIONS_PER_PROMPT,
            title="Global batch size",
            description=(
                f"Prompts x {recipe.GENERATIONS_PER_PROMPT} generations per step; the closed "
                "division scales its learning rate and clip from it. The reference runs of the "
                "RCP file use 256, 512 and 1024."
            ),
        ),
        "max_steps": Param(
            defaults.max_steps,
            type="integer",
            minimum=1,
            maximum=recipe.MAX_STEPS_LIMIT,
            title="Max steps",
            description=(
                "Training steps at most; a checkpoint is saved after every step from the "
                "validation start. The run ends at the first checkpoint above the target, or "
                f"as aborted at this step. Default: this deployment's ({defaults.max_steps})."
            ),
        ),
        "val_start_at": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            maximum=recipe.MAX_STEPS_LIMIT,
            title="Validation start override",
            description="Empty: ceil(2.5 + 3840 / global_batch_size).",
        ),
        "division": Param(
            defaults.division,
            type="string",
            enum=list(DIVISIONS),
            title="Division",
            description=(
                "closed: the reference hyperparameters (learning rate 1e-6 x sqrt(gbs/256), "
                "clip, AdamW as the rules fix them); open: the trainer's own (the local toy "
                "policy learns only at its own learning rate). Default: this deployment's "
                f"({defaults.division})."
            ),
        ),
        "eval_schedule": Param(
            defaults.eval_schedule,
            type="string",
            enum=list(SCHEDULES),
            values_display={
                "after_training": "after_training (the rules' wording)",
                "during_training": "during_training (not described by the rules)",
            },
            title="Evaluation schedule",
            description=(
                " ".join(RULES_WORDING[s] for s in SCHEDULES)
                + f" Default: this deployment's ({defaults.eval_schedule})."
            ),
        ),
        "eval_window": Param(
            defaults.eval_window,
            type="integer",
            minimum=1,
            maximum=MAX_EVAL_WINDOW,
            title="Evaluation window W",
            description=(
                "How many checkpoints of a run are evaluated at once: 1 = strictly in step "
                "order; more = speculative (a faster verdict, some evaluations wasted; the ones "
                "above the passing step are stopped at the verdict). Default: this "
                f"deployment's ({defaults.eval_window})."
            ),
        ),
    }


def run_params(defaults: FormDefaults) -> dict[str, Param]:
    """The Params of mlperf_grpo_run."""
    return {
        "run_dir": Param(
            type="string",
            minLength=1,
            title="Run folder",
            description=(
                "Absolute local path or gs://bucket/prefix under this deployment's storage "
                "root (unless it allows others); created if missing."
            ),
        ),
        "seed": Param(
            1,
            type="integer",
            minimum=0,
            maximum=recipe.MAX_SEED,
            title="Seed",
            description="The run's seed (logged as `seed`; each run of a submission has its own).",
        ),
        **training_params(defaults),
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


def check_under_root(name: str, path: str, deployment: Deployment) -> str:
    """`path` (checked by `check_path`) if it is below the deployment's storage root, where the
    RCP view can show it (links resolved first), or if the deployment allows other folders."""
    root = deployment.storage_root
    if deployment.allow_run_dirs_outside_root:
        return path
    if root.startswith("gs://") or path.startswith("gs://"):
        inside = path.startswith(root.rstrip("/") + "/")
    else:
        real_root, real = os.path.realpath(root), os.path.realpath(path)
        inside = real != real_root and os.path.commonpath([real_root, real]) == real_root
    if not inside:
        raise ParamError(
            f"{name}: {path} is outside this deployment's storage root {root} (from "
            f"{deployment.source}); choose a folder under it, or set "
            "allow_run_dirs_outside_root = true in the deployment"
        )
    return path


def _int(params: Mapping[str, Any], name: str, minimum: int, maximum: int) -> int:
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ParamError(f"{name}: must be an integer in {minimum}..{maximum}, got {value!r}")
    return value


def run_spec(params: Mapping[str, Any]) -> RunSpec:
    """Validate the Params of one run; raises ParamError naming the Param."""
    gbs = _int(params, "global_batch_size", 1, recipe.MAX_GLOBAL_BATCH_SIZE)
    try:
        recipe.check_global_batch_size(gbs)
    except ValueError as exc:
        raise ParamError(str(exc)) from exc
    max_steps = _int(params, "max_steps", 1, recipe.MAX_STEPS_LIMIT)
    override = params["val_start_at"]
    if override is not None:
        override = _int(params, "val_start_at", 1, recipe.MAX_STEPS_LIMIT)
    division = params["division"]
    if division not in DIVISIONS:
        raise ParamError(f"division: must be one of {DIVISIONS}, got {division!r}")
    schedule = params["eval_schedule"]
    if schedule not in SCHEDULES:
        raise ParamError(f"eval_schedule: must be one of {SCHEDULES}, got {schedule!r}")
    window = _int(params, "eval_window", 1, MAX_EVAL_WINDOW)
    spec = RunSpec(
        run_dir=check_path("run_dir", params["run_dir"]),
        seed=_int(params, "seed", 0, recipe.MAX_SEED),
        global_batch_size=gbs,
        max_steps=max_steps,
        val_start_at=override,
        division=division,
        eval_schedule=schedule,
        eval_window=window,
    )
    if spec.effective_val_start_at > max_steps:
        raise ParamError(
            f"val_start_at: validation would start at step {spec.effective_val_start_at}, after "
            f"max_steps {max_steps}, so no checkpoint would ever be evaluated"
        )
    return spec


class RunNotFound(ValueError):
    """The run_dir Param of a deferred evaluation names a folder without a manifest."""


class RunFolderBusy(ValueError):
    """The run_dir Param names a folder another DAG run's (or another program's) training holds
    now; the message names the holder and its lease."""


def refuse_a_live_run(run_dir: str, dag_id: str, run_id: str) -> None:
    """RunFolderBusy when a training of anyone but this DAG run holds `run_dir` now (its lease,
    `rcpflow.trainer.ownership.live_holder`): a second DAG run on a live run folder starts no
    job there (neither training, refused by the lease anyway, nor an evaluation of the live
    run's checkpoints) and writes nothing into it. A retry of this DAG run's own training
    (its owner identity) is this run."""
    holder = live_holder(run_dir)
    ours = airflow_owner(dag_id, run_id, "")
    if holder is None or (holder.owner or "").startswith(ours):
        return
    raise RunFolderBusy(
        f"run_dir: {run_dir} is being trained by {holder.describe()} "
        f"({lease_path(run_dir)}); this DAG run starts nothing there"
    )


@task(task_id=PLAN_TASK_ID, multiple_outputs=True)
def plan_run() -> dict[str, Any]:
    """First task of a run: the validated RunSpec (fails naming the Param, before any job);
    records the run's evaluation schedule in its folder (`rcpflow.verdict.schedule_record`)."""
    context = get_current_context()
    spec = run_spec(context["params"])
    check_under_root("run_dir", spec.run_dir, load_deployment())
    dag_run = context["dag_run"]
    refuse_a_live_run(spec.run_dir, dag_run.dag_id, dag_run.run_id)
    log.info("run spec: %s", spec)
    record_schedule(spec.run_dir, spec.schedule_record)
    log.info("%s", spec.schedule_record.statement())
    warning = closed_division_warning(spec.eval_schedule, spec.division)
    if warning is not None:
        log.warning("%s", warning)
    return spec.to_dict()


def run_dir_of(plan: XComArg) -> XComArg:
    """The ``run_dir`` output of `plan_run` (a multiple_outputs task: one XCom per key)."""
    if not isinstance(plan, PlainXComArg):
        raise TypeError(f"expected the output of plan_run, got {plan!r}")
    return plan["run_dir"]


@task
def existing_run() -> str:
    """First task of a deferred evaluation: the run_dir Param, checked to hold a manifest."""
    context = get_current_context()
    run_dir = check_path("run_dir", context["params"]["run_dir"])
    check_under_root("run_dir", run_dir, load_deployment())
    dag_run = context["dag_run"]
    refuse_a_live_run(run_dir, dag_run.dag_id, dag_run.run_id)
    manifest = RunLayout(run_dir).manifest
    if not storage_for(manifest).exists(manifest):
        raise RunNotFound(f"run_dir: {run_dir} has no manifest at {manifest}; nothing to evaluate")
    return run_dir
