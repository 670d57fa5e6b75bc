"""The ``train`` TaskGroup: the backend's training job for the run's spec, then ``check_outputs``
(the manifest and MLLOG the job left are a usable run); and ``train_command``, the task every
cluster backend's training job gets its argument list and run env from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import TaskGroup, XComArg, task

from tasks.backend_api.job_inputs import TrainInputs, train_inputs, train_inputs_of
from tasks.names import TRAIN_TASK_ID
from tasks.run.spec import RunSpec, XComValue
from tasks.run.stages import check_training_outputs

if TYPE_CHECKING:
    from tasks.backend_api.protocol import Backend
    from tasks.jobs.templates import TrainJob


def train_command(job: TrainJob, spec: XComArg, python: str) -> tuple[XComArg, XComArg]:
    """Task ``train_command`` for the RunSpec dict `spec` resolves to: the ``argv`` and ``env``
    outputs of `job_inputs.train_inputs` (the job's argument list, what the run adds to its
    env; no job env, no rendered job in an XCom). `python` fills ``{python}``."""

    @task(task_id="train_command", multiple_outputs=True)
    def command(spec: XComValue) -> TrainInputs:
        """The job's argv and what the run adds to its env (`job_inputs.train_inputs`)."""
        return train_inputs(job, RunSpec.from_dict(spec).job_values(), python)

    return train_inputs_of(command(spec))


@task
def check_outputs(spec: XComValue) -> dict[str, Any]:
    return check_training_outputs(RunSpec.from_dict(spec))


def train_group(backend: Backend, spec: XComArg) -> TaskGroup:
    """TaskGroup ``train`` for the RunSpec dict that `spec` resolves to."""
    with TaskGroup(group_id=TRAIN_TASK_ID) as group:
        backend.train_job(spec) >> check_outputs(spec)
    return group
