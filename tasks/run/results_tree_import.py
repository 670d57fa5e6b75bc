"""Backfill of a deferred evaluation from another evaluator's results: the optional Params of
``mlperf_grpo_deferred_eval`` that name a Tunix-style tree ``DIR/step_<N>/<stamp>-<id>/
summary.json`` (and the MLLOG its eval times come from), and the task that imports it.

What imports (`rcpflow.verdict.eval_import.import_results_tree`: the newest complete, valid
attempt per step) is in the run before the gate looks, so only the steps still undecided are
evaluated. A step whose attempts are all refused is evaluated as if the tree had nothing for it;
each refusal is logged with its reason. A tree with no summary at all is a wrong Param, refused
by name. (A train job's own checkpoint tree is another import: `tasks.run.train_result`.)
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import Param, get_current_context, task

from rcpflow.verdict.eval_import import EvalImportError, import_results_tree, results_tree_listing
from tasks.run.spec import ParamError, XComValue, check_path

log = logging.getLogger(__name__)


def tree_params() -> dict[str, Param]:
    """The optional Params of a backfill (fresh objects per DAG)."""
    return {
        "eval_tree": Param(
            None,
            type=["null", "string"],
            title="Evaluations to import",
            description="Optional: a Tunix-style tree DIR/step_<N>/<stamp>-<id>/summary.json "
            "(absolute path or gs://). What is valid there is imported; only the steps still "
            "undecided are evaluated.",
        ),
        "eval_times_from": Param(
            None,
            type=["null", "string"],
            title="Eval times from MLLOG",
            description="Optional, with eval_tree: the evaluating pipeline's MLLOG; each step's "
            "eval times are its eval_start/eval_stop of that checkpoint's samples_count "
            "(Tunix's summaries carry no eval wall clock).",
        ),
    }


@task
def import_eval_tree(run_dir: XComValue) -> dict[str, Any]:
    """Import the tree the ``eval_tree`` Param names into `run_dir` (nothing when it is empty)."""
    params = get_current_context()["params"]
    tree, times = params["eval_tree"], params["eval_times_from"]
    if tree is None:
        if times is not None:
            raise ParamError("eval_times_from: only used with eval_tree, which is empty")
        log.info("no eval_tree: nothing to import")
        return {"imported": [], "refused": {}, "skipped": []}
    tree = check_path("eval_tree", tree)
    times = None if times is None else check_path("eval_times_from", times)
    found, skipped = results_tree_listing(tree)
    for why in skipped:  # never dropped silently
        log.warning("eval_tree: %s", why)
    if not found:
        also = f" ({len(skipped)} entries skipped, first: {skipped[0]})" if skipped else ""
        raise ParamError(f"eval_tree: {tree} has no step_<N>/<attempt>/summary.json{also}")
    try:
        result = import_results_tree(run_dir, tree, eval_times_from=times)
    except EvalImportError as exc:
        raise ParamError(f"eval_tree: {exc}") from exc
    refused: dict[str, list[str]] = {}
    for step in result.steps:
        if step.imported is not None:
            log.info("%s", step.imported.describe())
        for _source, why in step.rejected:
            log.warning("step %d: not imported: %s", step.step, why)
            refused.setdefault(str(step.step), []).append(why)
    imported = [s.step for s in result.steps if s.imported is not None]
    log.info(
        "imported steps %s from %s; %d step(s) left to evaluate",
        imported,
        tree,
        len(result.steps) - len(imported),
    )
    return {"imported": imported, "refused": refused, "skipped": list(result.skipped)}
