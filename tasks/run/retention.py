"""The run DAG's ``retention`` task: the checkpoints no verdict needs any more, deleted once the
run is decided (`rcpflow.verdict.retention_apply`, the rule of `rcpflow.verdict.retention`).

Off unless the deployment's ``[retention]`` table (`tasks.deployment.RetentionSettings`) or the
run's ``retention`` Param says which evaluated checkpoints stay. The task follows ``check``:
after ``finalize`` wrote the verdict and the compliance checker accepted it, with every
evaluation of the run done (so, with ``settled``, the unevaluated checkpoints above the passing
step go too). A run whose check failed keeps everything for the person looking into it. The
apply's record (``retention.json``) is what `rcpflow status` and the RCP view show.

With ``[retention] while_training = true`` the evaluation group also runs
`retention_after_step` after each step's evaluation (`tasks.run.planned`), one at a time per
run (the record is one file): the evaluated checkpoints below the target go while training
runs (the newest full state stays), for a trainer whose resume tolerates it. Both take the run
folder's retention lock (`rcpflow.verdict.retention_lock`): while a person's ``rcpflow retention
apply`` holds it, the final task fails naming it, and the after-step one leaves the work to it.
The after-step task is opportunistic: a run folder it cannot plan is logged, never fails the
step (the final task names it and fails), so that retention never stands between an evaluation
and the verdict.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from airflow.sdk import Param, get_current_context, task

from rcpflow.verdict.retention import RetentionPolicy
from rcpflow.verdict.retention_apply import RetentionError, apply_run
from rcpflow.verdict.retention_lock import RetentionBusy
from tasks.deployment import (
    RETENTION_CHOICES,
    Deployment,
    RetentionChoice,
    RetentionSettings,
    load_deployment,
)
from tasks.jobs.templates import TrainResult
from tasks.run.spec import ParamError, RunSpec, XComValue
from tasks.run.train_result import checkpoint_root

log = logging.getLogger(__name__)

RETENTION_PARAM = "retention"


class RetentionTaskError(RuntimeError):
    """The run folder cannot be planned for retention, or another apply (a person's
    `rcpflow retention apply`) holds it; the message names the file."""


def retention_params(deployment: Deployment) -> dict[str, Param]:
    """The run DAG's ``retention`` Param, its default the deployment's ``[retention] keep``."""
    default = deployment.retention.keep
    return {
        RETENTION_PARAM: Param(
            default,
            type="string",
            enum=list(RETENTION_CHOICES),
            title="Retention",
            description=(
                "After the verdict, delete the checkpoints no verdict needs any more "
                "(docs/retention.md): off keeps everything; passing keeps the passing "
                "checkpoint, last-k the last evaluated ones ([retention] last_k), nothing "
                f"keeps none of them. Default: this deployment's ({default})."
            ),
        )
    }


def retention_choice(value: object) -> RetentionChoice:
    """The ``retention`` Param's value, or ParamError naming it."""
    if not isinstance(value, str) or value not in RETENTION_CHOICES:
        raise ParamError(
            f"{RETENTION_PARAM}: {value!r} is not one of {', '.join(RETENTION_CHOICES)}"
        )
    return cast(RetentionChoice, value)


def deletable_trees(
    run_dir: str, seed: int, settings: RetentionSettings, result: TrainResult
) -> tuple[str, ...]:
    """Foreign checkpoint trees retention may delete from besides the run's own: the train
    job's ``[jobs.train] result`` tree when ``[retention] foreign_trees`` allows it."""
    if not settings.foreign_trees:
        return ()
    root = checkpoint_root(run_dir, seed, result)
    return () if root is None else (root,)


def apply_retention(
    run_dir: str,
    seed: int,
    choice: RetentionChoice,
    settings: RetentionSettings,
    result: TrainResult,
    *,
    settled: bool,
) -> dict[str, Any] | None:
    """Apply the rule to the run with `choice` (None when off); what was deleted and kept."""
    if choice == "off":
        log.info("retention off: every checkpoint stays")
        return None
    policy = RetentionPolicy(choice, settings.last_k, settings.while_training)
    trees = deletable_trees(run_dir, seed, settings, result)
    try:
        applied = apply_run(run_dir, policy, settled=settled and settings.settled, trees=trees)
    except (RetentionError, RetentionBusy) as exc:  # RetentionBusy: a person's apply runs
        raise RetentionTaskError(str(exc)) from None
    parts = cast(list[dict[str, Any]], applied["parts"])
    deleted, kept = [], []
    for part in parts:
        where = f"step {part['step']}" + (" train_state" if part["part"] == "train_state" else "")
        if part.get("outcome") == "deleted":
            deleted.append(where)
            log.info("%s: deleted (%s), %s bytes", where, part["reason"], part["bytes"])
        else:
            kept.append(where)
            log.info("%s: kept (%s)", where, part.get("outcome") or part["reason"])
    freed = sum(int(p["bytes"]) for p in parts if p.get("outcome") == "deleted")
    return {"keep": choice, "deleted": deleted, "kept": kept, "bytes_deleted": freed}


def _apply_for_task(spec: XComValue, *, settled: bool) -> dict[str, Any] | None:
    """`apply_retention` for the running task: the run, the deployment, the Param's choice."""
    run = RunSpec.from_dict(spec)
    deployment = load_deployment()
    params = get_current_context()["params"]
    choice = retention_choice(params.get(RETENTION_PARAM, deployment.retention.keep))
    return apply_retention(
        run.run_dir,
        run.seed,
        choice,
        deployment.retention,
        deployment.jobs.train.result,
        settled=settled,
    )


@task(max_active_tis_per_dagrun=1, map_index_template="step {{ task.op_kwargs['step'] }}")
def retention_after_step(spec: XComValue, step: XComValue) -> dict[str, Any] | None:
    """After `step`'s evaluation (``[retention] while_training``): what the rule lets go now,
    deleted; the verdict's settled deletions wait for the final ``retention`` task."""
    try:
        return _apply_for_task(spec, settled=False)
    except RetentionTaskError as exc:
        log.warning("retention after step %s: %s (the final retention task tries again)", step, exc)
        return None


@task
def retention(spec: XComValue) -> dict[str, Any] | None:
    """After ``check``: the checkpoints the decided run no longer needs, deleted (or nothing,
    when the ``retention`` Param is off)."""
    return _apply_for_task(spec, settled=True)
