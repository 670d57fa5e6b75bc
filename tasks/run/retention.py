"""The run DAG's ``retention`` task: the checkpoints no verdict needs any more, deleted once the
run is decided (`rcpflow.retention.apply`, the rule of `rcpflow.retention.rule`).

Off unless the deployment's ``[retention]`` table (`tasks.deployment.RetentionSettings`) or the
run's ``retention`` Param says which evaluated checkpoints stay. The task follows ``check``:
after ``finalize`` wrote the verdict and the compliance checker accepted it, with every
evaluation of the run done (so, with ``settled``, the unevaluated checkpoints above the passing
step go too). A run whose check failed keeps everything for the person looking into it. The
apply's record (``retention.json``) is what `rcpflow status` and the RCP view show.

With ``[retention] while_training = true`` each step's evaluate task also applies the rule
once its summary is collected (`after_evaluation`, called by `tasks.run.evaluate_operator`'s
`EvaluateStep`): the evaluated checkpoints below the target go while training runs (the newest
full state stays), for a trainer whose resume tolerates it. It runs inside the evaluate task so
that a checkpoint decided below the target is gone before its evaluation's slot in the eval
window frees: a run then keeps at most the W checkpoints being evaluated and those waiting for
a slot (docs/retention.md), with no task start of the DAG's between an evaluation's end and its
deletion. The applies of one run take the run folder's retention lock
(`rcpflow.retention.lock`) one after another (`LOCK_PATIENCE_S`); while a person's
``rcpflow retention apply`` holds it longer, the final task fails naming it, and an evaluate
task leaves the work to it. The evaluate task's apply is opportunistic: whatever stops it is
logged, never fails the evaluation (the final task repeats the apply and fails naming it), so
that retention never stands between an evaluation and the verdict.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from airflow.sdk import Param, get_current_context, task

from rcpflow.retention.apply import RetentionError, apply_run
from rcpflow.retention.lock import RetentionBusy
from rcpflow.retention.rule import RetentionPolicy
from tasks.deployment import (
    RETENTION_CHOICES,
    Deployment,
    RetentionChoice,
    RetentionSettings,
    load_deployment,
)
from tasks.jobs.templates import TrainResult
from tasks.names import PLAN_TASK_ID
from tasks.run.spec import ParamError, RunSpec, XComValue
from tasks.run.train_result import checkpoint_root

if TYPE_CHECKING:
    from airflow.sdk import Context

log = logging.getLogger(__name__)

RETENTION_PARAM = "retention"
# How long an evaluate task's apply waits for the run folder's retention lock: another evaluate
# task's apply holds it for one apply (a listing of the run's checkpoint tree: milliseconds on
# a local disk, seconds on a large gs:// tree); held longer, it is a person's apply, whose work
# the final task finishes.
LOCK_PATIENCE_S = 30.0


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
    patience_s: float = 0.0,
) -> dict[str, Any] | None:
    """Apply the rule to the run with `choice` (None when off); what was deleted and kept
    (the lock waited for `patience_s` when another apply holds it)."""
    if choice == "off":
        log.info("retention off: every checkpoint stays")
        return None
    policy = RetentionPolicy(choice, settings.last_k, settings.while_training)
    trees = deletable_trees(run_dir, seed, settings, result)
    try:
        applied = apply_run(
            run_dir,
            policy,
            settled=settled and settings.settled,
            trees=trees,
            patience_s=patience_s,
        )
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


def retain_after_evaluation(
    run_dir: str,
    seed: int,
    step: int,
    choice: object,
    settings: RetentionSettings,
    result: TrainResult,
) -> dict[str, Any] | None:
    """After `step`'s evaluation (``[retention] while_training``): what the rule lets go now,
    deleted (the verdict's settled deletions wait for the final ``retention`` task); None when
    off or when it could not apply, which it logs: it never raises."""
    if not settings.while_training:
        return None
    try:
        return apply_retention(
            run_dir,
            seed,
            retention_choice(choice),
            settings,
            result,
            settled=False,
            patience_s=LOCK_PATIENCE_S,
        )
    except Exception as exc:
        # The step's summary is persisted and collected: nothing retention meets (a bad Param,
        # a busy lock, an unreadable tree, a storage error) may fail its evaluation. The final
        # task applies again and fails naming it.
        log.warning(
            "retention after step %s: %s (the final retention task tries again)",
            step,
            str(exc) or type(exc).__name__,
        )
        return None


def retention_args(context: Context) -> dict[str, Any] | None:
    """What `retain_after_evaluation` needs for the running evaluate task, as JSON (its
    deployment's ``[retention]``, the run's ``retention`` Param and seed; `retain` takes it, on a
    worker or on the triggerer, which loads no deployment); None when ``while_training`` is off
    or the run's seed cannot be read (logged: the final task applies)."""
    deployment = load_deployment()
    settings = deployment.retention
    if not settings.while_training:
        return None
    try:
        seed = RunSpec.from_dict(context["ti"].xcom_pull(task_ids=PLAN_TASK_ID)).seed
    except Exception as exc:  # as in retain_after_evaluation: never fails the evaluation
        log.warning("retention after an evaluation: the run's seed: %s (the final task tries "
                    "again)", str(exc) or type(exc).__name__)  # fmt: skip
        return None
    return {
        "seed": seed,
        "choice": context["params"].get(RETENTION_PARAM, settings.keep),
        "settings": dataclasses.asdict(settings),
        "train_result": dataclasses.asdict(deployment.jobs.train.result),
    }


def retain(run_dir: str, step: int, args: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`retain_after_evaluation` with `retention_args`'s JSON (nothing when None)."""
    if args is None:
        return None
    return retain_after_evaluation(
        run_dir,
        int(args["seed"]),
        step,
        args["choice"],
        RetentionSettings(**args["settings"]),
        TrainResult(**args["train_result"]),
    )


def after_evaluation(context: Context, run_dir: str, step: int) -> dict[str, Any] | None:
    """`retain_after_evaluation` for the running evaluate task of `step`."""
    return retain(run_dir, step, retention_args(context))


@task
def retention(spec: XComValue) -> dict[str, Any] | None:
    """After ``check``: the checkpoints the decided run no longer needs, deleted (or nothing,
    when the ``retention`` Param is off)."""
    return _apply_for_task(spec, settled=True)
