"""The ``train`` TaskGroup: the job nodes' training job for the run's spec
(`tasks.run.job_nodes.JobNodes.train_job`), then ``check_outputs`` (the manifest and MLLOG the
job left are a usable run)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import TaskGroup, XComArg, task

from tasks.names import TRAIN_TASK_ID
from tasks.run.spec import RunSpec, XComValue
from tasks.run.stages import check_training_outputs

if TYPE_CHECKING:
    from tasks.run.job_nodes import JobNodes


@task
def check_outputs(spec: XComValue) -> dict[str, Any]:
    return check_training_outputs(RunSpec.from_dict(spec))


def train_group(nodes: JobNodes, spec: XComArg) -> TaskGroup:
    """TaskGroup ``train`` for the RunSpec dict that `spec` resolves to."""
    with TaskGroup(group_id=TRAIN_TASK_ID) as group:
        nodes.train_job(spec) >> check_outputs(spec)
    return group
