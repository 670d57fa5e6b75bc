"""The ``train`` TaskGroup: the backend's training job for the run's spec, then ``check_outputs``
(the manifest and MLLOG the job left are a usable run)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import TaskGroup, XComArg, task

from tasks.run.spec import RunSpec, XComValue
from tasks.run.stages import check_training_outputs

if TYPE_CHECKING:
    from tasks.backend_api.protocol import Backend


@task
def check_outputs(spec: XComValue) -> dict[str, Any]:
    return check_training_outputs(RunSpec.from_dict(spec))


def train_group(backend: Backend, spec: XComArg) -> TaskGroup:
    """TaskGroup ``train`` for the RunSpec dict that `spec` resolves to."""
    with TaskGroup(group_id="train") as group:
        backend.train_job(spec) >> check_outputs(spec)
    return group
