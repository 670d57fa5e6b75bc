"""The cancel and teardown rules every cluster backend follows (docs/design.md: never kill a
running training because the cluster did not answer; cancel what a verdict made useless; clean
up in a teardown). The run task records which cluster job it is about to start, before starting
it, and then what became of it (`lifecycle_names.JOB_RECORD_KEY`): the backend's reference plus
``{"cancel", "why"}``, `cancel` None (pending) until the task itself decided. `CancelRecordedJobs`
is the teardown every backend subclasses with its cancel call (and its `log_name`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator

from tasks.backend_api.lifecycle_names import JOB_RECORD_KEY, RECORD_DECISION

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.types import Operator


def should_cancel(recorded: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether the teardown cancels (deletes) a cluster job the run task recorded, and why."""
    if recorded.get(RECORD_DECISION) is None:
        return True, "the run task ended without deciding (marked by hand, or timed out)"
    return bool(recorded[RECORD_DECISION]), str(recorded["why"])


def _records(found: object) -> list[dict[str, Any]]:
    found = _decoded(found)
    if isinstance(found, dict):
        return [found]
    if not isinstance(found, list | tuple):
        return []
    return [dict(r) for r in map(_decoded, found) if isinstance(r, dict) and r]


def _decoded(value: object) -> object:
    """A record as it was pushed. Airflow 3.3.2 stores the XComs of a task its trigger ended
    (`task_end`) JSON-encoded twice (`XComModel.set` serializes the value, then the JSON column
    again), so they are read back as the JSON text of the record."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def recorded_jobs(context: Context, run_task_id: str, *, mapped: bool) -> list[dict[str, Any]]:
    """The records of `run_task_id` (this map index's, or every instance's when `mapped`)."""
    ti = context["ti"]
    where: dict[str, Any] = {} if mapped else {"map_indexes": ti.map_index}
    return _records(ti.xcom_pull(task_ids=run_task_id, key=JOB_RECORD_KEY, **where))


class CancelRecordedJobs(BaseOperator):
    """Teardown: cancel the jobs that the task `run_task_id` recorded (this map index's, or
    every instance's when `mapped`) when `should_cancel` says so; the backend's `cancel_job`
    cancels one. Nothing recorded: logged, success."""

    ui_color = "#fce8e6"
    # How the log names the job of a record: the run task's `ClusterJobOperator.log_name`.
    log_name: ClassVar[str] = "{name}"

    def __init__(self, *, run_task_id: str, mapped: bool = False, **kwargs: Any) -> None:
        super().__init__(**{"task_id": "cleanup", **kwargs})
        self.run_task_id = run_task_id
        self.mapped = mapped

    def where(self, ref: Mapping[str, Any]) -> str:
        """The job of `ref` as the log names it (`log_name`)."""
        return self.log_name.format_map(ref)

    def cancel_job(self, ref: Mapping[str, Any], why: str) -> dict[str, Any] | None:
        """Cancel the job of `ref` (its task decided so, `why`); what the teardown returns for
        it, None for nothing."""
        raise NotImplementedError

    def left(self, ref: Mapping[str, Any]) -> dict[str, Any] | None:
        """What the teardown returns for a job it leaves as it is (None: nothing)."""
        return None

    def execute(self, context: Context) -> Any:
        refs = recorded_jobs(context, self.run_task_id, mapped=self.mapped)
        if not refs:
            self.log.info("%s recorded no job: nothing to cancel", self.run_task_id)
        done = []
        for ref in refs:
            wanted, why = should_cancel(ref)
            if wanted:
                result = self.cancel_job(ref, why)
            else:
                self.log.warning("%s is left as it is: %s", self.where(ref), why)
                result = self.left(ref)
            if result is not None:
                done.append(result)
        return done


def with_cleanup(work: Operator, cleanup: CancelRecordedJobs) -> None:
    """`cleanup` (task ``cleanup``) as the teardown of `work`: it cancels what `work` started,
    also when `work` fails."""
    work >> cleanup.as_teardown()
