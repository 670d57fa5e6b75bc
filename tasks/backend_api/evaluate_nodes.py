"""The two evaluate nodes every backend builds (`protocol.Backend.evaluate`,
`.evaluate_checkpoint`): the backend's evaluate operator mapped over the checkpoint rows, or
for one step, each with the backend's teardown, which cancels what it started
(`teardown.with_cleanup`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tasks.backend_api.teardown import CancelRecordedJobs, with_cleanup

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, XComArg
    from airflow.sdk.definitions._internal.mixins import DependencyMixin

# How the UI labels an evaluate instance: by the step it evaluates.
ROW_MAP_INDEX = "step {{ task.row['step'] }}"
STEP_MAP_INDEX = "step {{ task.step }}"

# The teardown of an evaluate node, given the node's task id.
Cleanup = Callable[[str], CancelRecordedJobs]


def evaluate_rows(
    operator: type[BaseOperator],
    run_dir: str | XComArg,
    rows: XComArg,
    kwargs: Mapping[str, Any],
    cleanup: Cleanup,
) -> DependencyMixin:
    """`operator` (made with `kwargs`) once per checkpoint row of `rows`, with `cleanup` (a
    teardown of every instance's jobs)."""
    evaluate = operator.partial(run_dir=run_dir, map_index_template=ROW_MAP_INDEX, **kwargs)
    mapped = evaluate.expand(row=rows)
    with_cleanup(mapped, cleanup(mapped.task_id))
    return mapped


def evaluate_step(
    operator: type[BaseOperator],
    run_dir: str | XComArg,
    step: int | XComArg,
    kwargs: Mapping[str, Any],
    cleanup: Cleanup,
) -> DependencyMixin:
    """`operator` (made with `kwargs`) for the checkpoint of `step`, with `cleanup` (a teardown
    of that instance's job only)."""
    # run_dir and step are template fields: an XComArg is resolved before execute
    evaluate = operator(map_index_template=STEP_MAP_INDEX, run_dir=run_dir, step=step, **kwargs)
    with_cleanup(evaluate, cleanup(evaluate.task_id))
    return evaluate
