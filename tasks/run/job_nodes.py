"""The nodes that run a run's jobs, built once from any driver (`JobNodes`): the training job
(``train_command`` -> TaskGroup ``job``: ``run`` -> ``cleanup`` teardown) and the evaluation of
the checkpoints (one mapped ``evaluate`` over the manifest rows, or one per planned step), each
with the teardown that cancels what it started. Every backend builds the same graph, the local
one included, so `make demo` runs the nodes a cluster runs.

Evaluation is one mapped deferrable operator rather than a group per step, so that
``max_active_tis_per_dagrun`` is the eval window exactly (docs/airflow.md).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import TaskGroup, XComArg, task
from airflow.sdk.definitions.xcom_arg import PlainXComArg

from tasks.backend_api.job_inputs import train_inputs
from tasks.backend_api.job_operator import RunJobOperator
from tasks.backend_api.lifecycle_names import TRAIN_LABEL
from tasks.backend_api.teardown import CancelRecordedJobs, with_cleanup
from tasks.backends.registry import driver_for
from tasks.deployment import MAX_EVAL_WINDOW, Deployment
from tasks.names import EVALUATE_TASK_ID
from tasks.run.evaluate_operator import EvaluateOperator
from tasks.run.spec import RunSpec, XComValue, run_dir_of

if TYPE_CHECKING:
    from airflow.sdk.definitions._internal.mixins import DependencyMixin

    from tasks.backend_api.protocol import JobDriver

# The ids of the training job's nodes in the ``train`` group.
TRAIN_COMMAND_TASK_ID = "train_command"
JOB_GROUP_ID = "job"
# The task documentation of every per-step instance: where its step is when the grid shows a
# bare map index (docs/airflow.md: rendered_map_index).
RCP_VIEW_DOC = """Each instance is one checkpoint, labelled `step N` once it has run. Instances that
never ran a task process show their bare map index instead (not yet started, a `wait` that
lives on the triggerer only, or skipped after a lower step passed): Airflow 3.3 renders the
label only in a task process. The run's checkpoint table, with every step's state and summary,
is the RCP tab of this DAG run (`/rcp/dag-run/<dag_id>/<run_id>`)."""

# How the UI labels an evaluate instance: by the step it evaluates.
ROW_MAP_INDEX = "step {{ task.row['step'] }}"
STEP_MAP_INDEX = "step {{ task.step }}"


class JobNodes:
    """The job nodes of the run DAG and the deferred-eval DAG for `driver` (see the module
    doc), with the deployment's timeouts, retries, eval window and cluster queue."""

    def __init__(self, driver: JobDriver, deployment: Deployment) -> None:
        self.driver = driver
        self.deployment = deployment
        # every task that talks to a cluster goes to its queue; a worker's own jobs stay put
        self.queue: dict[str, Any] = (
            {} if driver.jobs_run_on_worker else dict(deployment.cluster_task_kwargs())
        )

    def train_job(self, spec: XComArg) -> DependencyMixin:
        """Task ``train_command`` (the job's argument list, what the run adds to its env and
        the driver's extra, for the RunSpec dict `spec` resolves to: no job env, no rendered
        job in an XCom) -> TaskGroup ``job``; what the output check waits for."""
        driver, job, d = self.driver, self.deployment.jobs.train, self.deployment

        @task(task_id=TRAIN_COMMAND_TASK_ID, multiple_outputs=True)
        def train_command(spec: XComValue) -> dict[str, Any]:
            """The job's argv, what the run adds to its env, and the driver's extra."""
            values = RunSpec.from_dict(spec).job_values()
            inputs = train_inputs(job, values, driver.python)
            return {**inputs, "extra": driver.train_extra(values)}

        command = train_command(spec)
        if not isinstance(command, PlainXComArg):
            raise TypeError(f"expected the output of train_command, got {command!r}")
        with TaskGroup(group_id=JOB_GROUP_ID) as group:
            # The job is cancelled if the trainer has not ended a grace period after the run's
            # stop request (the trainer reads it from storage); only evaluation during
            # training (a run's Param) writes one.
            run = RunJobOperator(
                task_id="run", driver=driver, role="train", label=TRAIN_LABEL,
                argv=command["argv"], env=driver.job_env(job), run_env=command["env"],
                extra=command["extra"], run_dir=run_dir_of(spec),
                stop_run_dir=run_dir_of(spec),
                job_timeout=timedelta(minutes=d.train_timeout_minutes),
                retries=driver.run_retries,
                retry_delay=timedelta(seconds=driver.poll_interval_s), **self.queue,
            )  # fmt: skip
            with_cleanup(run, self.cleanup(run.task_id))
        return group

    def cleanup(self, task_id: str, *, mapped: bool = False) -> CancelRecordedJobs:
        """The teardown of the jobs the task `task_id` recorded."""
        return CancelRecordedJobs(
            driver=self.driver, run_task_id=task_id, mapped=mapped, **self.queue
        )

    def _evaluate_kwargs(self, window: int) -> dict[str, Any]:
        """What every ``evaluate`` is given: the job, the eval window, the bounds; its retries
        adopt the step's job after a lost watch."""
        d = self.deployment
        return {
            "task_id": EVALUATE_TASK_ID,
            "driver": self.driver,
            "eval_job": d.jobs.evaluate,
            "max_active_tis_per_dagrun": window,
            "job_timeout": timedelta(minutes=d.eval_timeout_minutes),
            "retries": d.eval_retries,
            # soon: a Slurm retry takes the job that ended with success only within
            # slurmctld's MinJobAge (300 s by default, Airflow's default delay), docs/slurm.md
            "retry_delay": timedelta(seconds=self.driver.poll_interval_s),
            "doc_md": RCP_VIEW_DOC,
            **self.queue,
        }

    def evaluate(self, run_dir: str | XComArg, rows: XComArg) -> DependencyMixin:
        """Task ``evaluate`` mapped over the manifest rows `rows` resolves to, one instance per
        checkpoint labelled ``step N``, with a teardown of every instance's jobs; what finalize
        waits for."""
        kwargs = self._evaluate_kwargs(self.deployment.eval_window)
        evaluate = EvaluateOperator.partial(
            run_dir=run_dir, map_index_template=ROW_MAP_INDEX, **kwargs
        )
        mapped = evaluate.expand(row=rows)
        with_cleanup(mapped, self.cleanup(mapped.task_id, mapped=True))
        return mapped

    def evaluate_checkpoint(self, run_dir: str | XComArg, step: int | XComArg) -> DependencyMixin:
        """Task ``evaluate`` of the checkpoint of the planned `step`, inside the run DAG's mapped
        task group ``checkpoint``, with a teardown of its job; the step's ``wait`` holds it to
        the run's eval window (a Param), so its own limit is only a ceiling
        (`MAX_EVAL_WINDOW`)."""
        # run_dir and step are template fields: an XComArg is resolved before execute
        evaluate = EvaluateOperator(
            map_index_template=STEP_MAP_INDEX, run_dir=run_dir, step=step,
            **self._evaluate_kwargs(MAX_EVAL_WINDOW),
        )  # fmt: skip
        with_cleanup(evaluate, self.cleanup(evaluate.task_id))
        return evaluate


def nodes_for(deployment: Deployment) -> JobNodes:
    """The job nodes of the backend the deployment names (`protocol.driver_for`)."""
    return JobNodes(driver_for(deployment), deployment)
