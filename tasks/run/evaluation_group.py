"""The ``evaluation`` TaskGroup, shared by the run DAG and the deferred-eval DAG:
``load_manifest`` -> the job nodes' ``evaluate``, mapped over the rows (labelled ``step N``; each
instance behind the steps of `tasks.run.stages`) -> ``finalize`` -> ``check``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import TaskGroup, TriggerRule, XComArg, task

from tasks.names import COMPLIANCE_TOOL
from tasks.results.assets import COMPLIANCE, MLLOG, publish
from tasks.results.verdicts import verdict_path
from tasks.run.spec import XComValue
from tasks.run.stages import check_run, finalize_run, load_rows

if TYPE_CHECKING:
    from tasks.run.job_nodes import JobNodes


@task
def load_manifest(run_dir: XComValue) -> list[dict[str, Any]]:
    return load_rows(run_dir)


# A skipped evaluate (decided by a lower step) must not stop finalize; a failed one must.
@task(trigger_rule=TriggerRule.NONE_FAILED, outlets=[MLLOG])
def finalize(run_dir: XComValue) -> dict[str, Any]:
    result = finalize_run(run_dir)
    publish(MLLOG, result["log_path"], status=result["status"], step=result.get("step"))
    return result


@task(outlets=[COMPLIANCE])
def check(run_dir: XComValue) -> dict[str, Any]:
    result = check_run(run_dir)
    publish(COMPLIANCE, verdict_path(run_dir, COMPLIANCE_TOOL), ok=result["ok"])
    return result


def evaluation_group(nodes: JobNodes, run_dir: str | XComArg) -> TaskGroup:
    """TaskGroup ``evaluation`` over the run at `run_dir` (a value or an XComArg)."""
    with TaskGroup(group_id="evaluation") as group:
        rows = load_manifest(run_dir)
        nodes.evaluate(run_dir, rows) >> finalize(run_dir) >> check(run_dir)
    return group
