"""The ``evaluation`` TaskGroup, shared by the run DAG and the deferred-eval DAG:
``load_manifest`` -> the backend's ``evaluate``, mapped over the rows (labelled ``step N``; each
instance behind the steps of `tasks.run.stages`) -> ``finalize`` -> ``check``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import TaskGroup, TriggerRule, XComArg, task

from tasks.names import COMPLIANCE_TOOL
from tasks.results.assets import COMPLIANCE, MLLOG, publish
from tasks.results.verdicts import verdict_path
from tasks.run.spec import XComValue
from tasks.run.stages import check_run, finalize_run, load_rows

# The task documentation of every per-step instance: where its step is when the grid shows a
# bare map index (docs/airflow.md: rendered_map_index).
RCP_VIEW_DOC = """Each instance is one checkpoint, labelled `step N` once it has run. Instances that
never ran a task process show their bare map index instead (not yet started, a `wait` that
lives on the triggerer only, or skipped after a lower step passed): Airflow 3.3 renders the
label only in a task process. The run's checkpoint table, with every step's state and summary,
is the RCP tab of this DAG run (`/rcp/dag-run/<dag_id>/<run_id>`)."""

if TYPE_CHECKING:
    from tasks.backend_api.protocol import Backend


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


def evaluation_group(backend: Backend, run_dir: str | XComArg) -> TaskGroup:
    """TaskGroup ``evaluation`` over the run at `run_dir` (a value or an XComArg)."""
    with TaskGroup(group_id="evaluation") as group:
        rows = load_manifest(run_dir)
        backend.evaluate(run_dir, rows) >> finalize(run_dir) >> check(run_dir)
    return group
