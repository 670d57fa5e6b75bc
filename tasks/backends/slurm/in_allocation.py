"""Evaluation in the training's allocation (`slurm.eval_in_training_allocation`, the
reference's schedule), on the renderer's side: what the deployment must allow for it
(`check_in_allocation`: an evaluate command and a foreign result's path the batch script can
fill), and the fields of `script.InAllocationEval` for one run (`in_allocation_fields`, a
task's return value) and back (`in_allocation_eval`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tasks.backends.slurm.script import IN_ALLOCATION_STEP_FIELDS, InAllocationEval
from tasks.deployment import DeploymentError
from tasks.jobs.command import check_template, fill

if TYPE_CHECKING:
    from tasks.backends.slurm.settings import SlurmSettings
    from tasks.deployment import Deployment
    from tasks.jobs.templates import EvaluateJob


def check_in_allocation(deployment: Deployment, settings: SlurmSettings) -> None:
    """Refuse what an evaluation in the training's allocation cannot do, naming the key."""
    where = f"{deployment.source}: slurm.eval_in_training_allocation"
    job = deployment.jobs.evaluate
    allowed = {"python", "run_dir", "seed", *IN_ALLOCATION_STEP_FIELDS}
    # A foreign result is imported in the allocation as the evaluate step would import it
    # (`rcpflow eval import --since`): its path must be one the batch script can fill too.
    result_names = (
        check_template("evaluate", job.result.path) if job.result.imported else frozenset()
    )
    for key, names in (
        ("jobs.evaluate.command", job.job_command.placeholders),
        ("jobs.evaluate.result.path", result_names),
    ):
        per_row = sorted(set(names) - allowed)
        if per_row:
            raise DeploymentError(
                f"{where}: {key} uses {', '.join(per_row)}, which the batch script cannot "
                f"fill (it may use {', '.join(IN_ALLOCATION_STEP_FIELDS)}, run_dir, seed)"
            )
    if settings.evaluate.nodes > settings.train.nodes:
        raise DeploymentError(
            f"{where}: slurm.evaluate.nodes={settings.evaluate.nodes} is more than the "
            f"training's allocation (slurm.train.nodes={settings.train.nodes})"
        )


def in_allocation_fields(
    evaluate: EvaluateJob, settings: SlurmSettings, values: Mapping[str, str | int]
) -> dict[str, Any]:
    """The evaluate command with only ``{step}``/``{summary_dir}`` left, and the steps the
    training of the run of `values` (`RunSpec.job_values`) may save (JSON)."""
    known = {"python": settings.python, "run_dir": values["run_dir"], "seed": values["seed"]}
    escaped = {k: str(v).replace("{", "{{").replace("}", "}}") for k, v in known.items()}
    left = {name: f"{{{name}}}" for name in IN_ALLOCATION_STEP_FIELDS}
    shape = settings.evaluate
    result = evaluate.result
    return {
        "argv": [fill(item, {**escaped, **left}) for item in evaluate.command],
        # "": the job writes rcpflow's own summary; else imported after it (`InAllocationEval`)
        "result_format": result.format if result.imported else "",
        "result_path": fill(result.path, {**escaped, **left}) if result.imported else "",
        "python": settings.python,
        "run_dir": str(values["run_dir"]),
        "first": int(values["val_start_at"]),
        "last": int(values["max_steps"]),
        "nodes": shape.nodes,
        "ntasks_per_node": shape.ntasks_per_node,
        "env": dict(evaluate.env),
    }


def in_allocation_eval(fields: object) -> InAllocationEval | None:
    """`in_allocation_fields` as the operator gets them (an XCom resolved; None: none)."""
    if fields is None:
        return None
    if not isinstance(fields, Mapping):
        raise ValueError(f"then_evaluate must be a mapping, got {fields!r}")
    env = dict(fields.get("env") or {})
    return InAllocationEval(**{**fields, "argv": tuple(fields["argv"]), "env": env})
