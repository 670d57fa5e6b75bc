"""Running a job operator on the Slurm driver as Airflow would, without a scheduler: `execute`,
then each deferral's trigger (the one `WatchTrigger`) on an event loop until its event, then the
method it named; a `FakeTI` for XComs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from airflow.sdk.exceptions import TaskDeferred


@dataclass
class FakeTI:
    task_id: str = "job.run"
    map_index: int = -1
    pushed: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def xcom_pull(self, *, task_ids: str, key: str, map_indexes: int | None = None) -> Any:
        return self.pushed.get(key)


def context(run_id: str = "manual__test", task_id: str = "job.run") -> dict[str, Any]:
    dag_run = SimpleNamespace(dag_id="mlperf_grpo_run", run_id=run_id)
    return {
        "ti": FakeTI(task_id=task_id),
        "dag_run": dag_run,
        "dag": SimpleNamespace(dag_id=dag_run.dag_id),
        "run_id": run_id,
    }


async def first_event(trigger: Any, timeout_s: float) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return await asyncio.wait_for(first(), timeout_s)


@dataclass
class Driven:
    result: Any = None
    events: list[dict[str, Any]] = field(default_factory=list)
    job_ids: list[str] = field(default_factory=list)


def start(op: Any, ctx: dict[str, Any]) -> TaskDeferred:
    """`execute` up to its first deferral."""
    try:
        op.execute(ctx)
    except TaskDeferred as deferred:
        return deferred
    raise AssertionError("execute did not defer")


def drive(
    op: Any, ctx: dict[str, Any], deferred: TaskDeferred | None = None, timeout_s: float = 300
) -> Driven:
    """Run `op` to its end (or its exception) from `deferred` (else from `execute`); the
    events seen and the job ids watched are in `driven` (also on the exception, as .driven)."""
    driven = Driven()
    if deferred is None:
        try:
            driven.result = op.execute(ctx)
            return driven
        except TaskDeferred as d:
            deferred = d
    while True:
        trigger = deferred.trigger
        driven.job_ids.append(trigger.ref["job_id"])
        event = asyncio.run(first_event(trigger, timeout_s))
        driven.events.append(event)
        try:
            driven.result = getattr(op, deferred.method_name)(ctx, event)
            return driven
        except TaskDeferred as d:
            deferred = d
        except BaseException as exc:
            exc.driven = driven  # type: ignore[attr-defined]
            raise
