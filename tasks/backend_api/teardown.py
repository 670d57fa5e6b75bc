"""The cancel and teardown rules every cluster backend follows (docs/design.md: never kill a
running training because the cluster did not answer; cancel what a verdict made useless; clean
up in a teardown). The run task records which cluster job it is about to start, before starting
it, and then what became of it (`lifecycle_names.JOB_RECORD_KEY`): the backend's reference plus
``{"cancel", "why"}``, `cancel` None (pending) until the task itself decided. `CancelRecordedJobs`
is the one teardown, for every driver."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from tasks.backend_api.lifecycle_names import JOB_RECORD_KEY, RECORD_DECISION

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.types import Operator

    from tasks.backend_api.protocol import JobDriver


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
    every instance's when `mapped`) through `driver` when `should_cancel` says so, then let the
    driver remove what the ended ones left (`JobDriver.remove`). Nothing recorded: logged,
    success. Returns ``{"job", "cancelled"}`` per job it cancelled or left."""

    ui_color = "#fce8e6"

    def __init__(
        self, *, driver: JobDriver, run_task_id: str, mapped: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**{"task_id": "cleanup", **kwargs})
        self.driver = driver
        self.run_task_id = run_task_id
        self.mapped = mapped

    def execute(self, context: Context) -> Any:
        refs = recorded_jobs(context, self.run_task_id, mapped=self.mapped)
        if not refs:
            self.log.info("%s recorded no job: nothing to cancel", self.run_task_id)
        done, failed = [], []
        for record in refs:
            ref = {k: v for k, v in record.items() if k not in (RECORD_DECISION, "why")}
            where = self.driver.describe(ref)
            wanted, why = should_cancel(record)
            cancelled = False
            try:
                if wanted:
                    cancelled = self.driver.cancel(ref)
                    said = "cancelled" if cancelled else "had ended"
                    self.log.info("%s %s (%s)", where, said, why)
                else:
                    self.log.warning("%s is left as it is: %s", where, why)
                self.driver.remove(ref)  # what an ended job left (a running one keeps it)
            except Exception as exc:  # the others are still cancelled; this one is named
                self.log.error("%s: not cancelled: %r", where, exc)
                failed.append(f"{where}: {exc}")
            done.append({"job": where, "cancelled": cancelled})
        if failed:
            raise RuntimeError(f"{len(failed)} job(s) not cancelled: {'; '.join(failed)}")
        return done


def with_cleanup(work: Operator, cleanup: CancelRecordedJobs) -> None:
    """`cleanup` (task ``cleanup``) as the teardown of `work`: it cancels what `work` started,
    also when `work` fails."""
    work >> cleanup.as_teardown()
