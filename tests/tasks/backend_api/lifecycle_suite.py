"""The one job lifecycle's suite (tasks.backend_api: `RunJobOperator`, `WatchTrigger`,
`CancelRecordedJobs`), written once and run against every driver: a test module subclasses
`LifecycleSuite` and gives its `case` fixture (a `Case`: the driver, an argv per kind of job,
how to tell a job still runs, how to plant a job of our name that is not ours). Covered: a start
recorded and watched; a worker lost after the submit and the retry adopting; ended ok and
failed; a stop request and its grace; an outage within and past the budget; the cancel of a
step after a pass; the teardown; ``on_kill``; a foreign job of our name never touched. (The
restart budget is the fake's and Slurm's: a driver that restarts jobs.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from tasks.backend_api import watch_trigger
from tasks.backend_api.job_operator import RunJobOperator
from tasks.backend_api.job_state import JobState
from tasks.backend_api.lifecycle_names import ENDED, JOB_RECORD_KEY, STOPPED, UNREACHABLE, WATCHING
from tasks.backend_api.protocol import JobDriver, JobRequest
from tasks.backend_api.teardown import CancelRecordedJobs


@dataclass
class Case:
    """A driver under test: its argv for a job that ends ok, fails or runs on until cancelled
    (`argv`: "ok", "fail", "long"), whether a job still runs (`alive`), a job of our name that
    is not ours (`foreign`, planted for a request), the run folder, and the DAG run the jobs
    belong to (unique per test: a job left by one test is never another's to adopt)."""

    driver: JobDriver
    argv: Callable[[str], tuple[str, ...]]
    alive: Callable[[Mapping[str, Any]], bool]
    foreign: Callable[[JobRequest], Mapping[str, Any]]
    run_dir: str
    dag_id: str = "lifecycle"
    run_id: str = "run-1"
    # a driver whose foreign job the test can see running after the cancel it refused
    foreign_visible: bool = True
    # its jobs run in real time (they end by themselves, not by being read)
    real_time: bool = True


class TaskInstance:
    def __init__(self, try_number: int = 1) -> None:
        self.task_id, self.map_index, self.try_number = "train.job.run", -1, try_number
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value

    def xcom_pull(self, *, task_ids: str, key: str, **where: Any) -> Any:
        return self.xcoms.get(key)


def context_of(case: Case, ti: TaskInstance) -> Any:
    return {"ti": ti, "dag_run": SimpleNamespace(dag_id=case.dag_id, run_id=case.run_id)}


def operator_for(
    case: Case, kind: str, role: str = "train", label: str = "train"
) -> RunJobOperator:
    return RunJobOperator(
        task_id="run", driver=case.driver, role=role, label=label,  # type: ignore[arg-type]
        argv=list(case.argv(kind)), run_dir=case.run_dir, stop_run_dir=case.run_dir,
    )  # fmt: skip


def start(case: Case, op: RunJobOperator, ti: TaskInstance) -> watch_trigger.WatchTrigger:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context_of(case, ti))
    trigger = deferred.value.trigger
    assert isinstance(trigger, watch_trigger.WatchTrigger)
    return trigger


def first_event(trigger: watch_trigger.WatchTrigger) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the watch ended without an event")

    return asyncio.run(asyncio.wait_for(first(), timeout=60))


def until_ended(trigger: watch_trigger.WatchTrigger) -> dict[str, Any]:
    """The watch's events, deferring again on each WATCHING one, until the job's end."""
    for _ in range(20):
        event = first_event(trigger)
        if event["phase"] != WATCHING:
            return event
        trigger = watch_trigger.WatchTrigger(**event["kwargs"])
    raise AssertionError("the job never ended")


def run_to_end(case: Case, kind: str) -> tuple[RunJobOperator, TaskInstance, dict[str, Any]]:
    """A job of `kind` started by its run operator and watched to its end: the operator, the
    task instance and the last event."""
    ti = TaskInstance()
    op = operator_for(case, kind)
    return op, ti, until_ended(start(case, op, ti))


class _Failing:
    """A driver whose first `failures` reads fail (None: every read)."""

    def __init__(self, driver: JobDriver, failures: int | None) -> None:
        self.driver, self.failures, self.reads = driver, failures, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.driver, name)

    async def read(self, ref: Mapping[str, Any], memo: dict[str, Any], now: float) -> JobState:
        self.reads += 1
        if self.failures is None or self.reads <= self.failures:
            raise ConnectionError("no answer")
        return await self.driver.read(ref, memo, now)


class LifecycleSuite:
    """The suite; a subclass gives the `case` fixture (see the module doc)."""

    @pytest.fixture
    def clock(self, monkeypatch: pytest.MonkeyPatch) -> list[float]:
        """The watch's simulated clock: sleeping moves it, nothing waits."""
        now = [1_000_000.0]

        async def sleep(seconds: float) -> None:
            now[0] += seconds
            await asyncio.sleep(0)

        monkeypatch.setattr(watch_trigger, "_now", lambda: now[0])
        monkeypatch.setattr(watch_trigger, "_sleep", sleep)
        return now

    def test_a_job_starts_recorded_and_watched_through_its_driver(self, case: Case) -> None:
        ti = TaskInstance()
        trigger = start(case, operator_for(case, "long"), ti)
        record = ti.xcoms[JOB_RECORD_KEY]
        assert record["cancel"] is None and record["why"] == "running"
        kwargs = trigger.kwargs()
        assert kwargs["driver"] == case.driver.name and kwargs["driver_args"] == case.driver.args()
        ref = {k: v for k, v in record.items() if k not in ("cancel", "why")}
        assert kwargs["ref"] == ref and case.alive(ref)
        json.dumps(kwargs)  # the whole watch is JSON (Airflow stores it)
        case.driver.cancel(ref)

    def test_a_retry_adopts_the_job_an_earlier_try_left_running(self, case: Case) -> None:
        first = start(case, operator_for(case, "long"), TaskInstance())
        again = start(case, operator_for(case, "long"), TaskInstance(try_number=2))
        assert again.ref == first.ref  # the worker was lost after the submit: one job, adopted
        assert case.alive(first.ref)
        case.driver.cancel(first.ref)

    def test_a_job_that_ends_ok_succeeds_its_task_and_is_recorded_for_the_teardown(
        self,
        case: Case,
    ) -> None:
        op, ti, event = run_to_end(case, "ok")
        assert event["phase"] == ENDED and event["state"]["outcome"] == "succeeded"
        result = op.execute_complete(context_of(case, ti), event)
        assert result["outcome"] == "succeeded" and result["exit_code"] == 0
        assert ti.xcoms[JOB_RECORD_KEY]["cancel"] is True

    def test_a_job_that_fails_fails_its_task_naming_it_and_quoting_its_output(
        self, case: Case
    ) -> None:
        op, ti, event = run_to_end(case, "fail")
        assert event["state"]["outcome"] == "failed"
        with pytest.raises(AirflowException) as failed:
            op.execute_complete(context_of(case, ti), event)
        assert not isinstance(failed.value, AirflowFailException)  # a retry runs it again
        message = str(failed.value)
        assert message.startswith(case.driver.describe(event["ref"]))
        assert "last output lines" in message

    def test_a_stop_request_cancels_the_job_after_its_grace(
        self, case: Case, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        requested = SimpleNamespace(reason="the run passed at step 19")
        monkeypatch.setattr(watch_trigger, "current", lambda run_dir: requested)
        ti = TaskInstance()
        op = operator_for(case, "long")
        trigger = start(case, op, ti)
        trigger.stop_grace_s = 0.0
        assert trigger.stop_run_dir == case.run_dir
        event = first_event(trigger)
        assert event["phase"] == STOPPED and not case.alive(trigger.ref)
        result = op.execute_complete(context_of(case, ti), event)
        assert result["outcome"] == "stopped" and ti.xcoms[JOB_RECORD_KEY]["cancel"] is True

    def test_an_outage_within_the_budget_is_ridden_out(
        self, case: Case, clock: list[float]
    ) -> None:
        ti = TaskInstance()
        op = operator_for(case, "ok")
        trigger = start(case, op, ti)
        trigger._driver = _Failing(case.driver, failures=3)  # type: ignore[assignment]
        while case.real_time and case.alive(trigger.ref):  # let a real job end first
            asyncio.run(asyncio.sleep(0.05))
        event = until_ended(trigger)
        assert event["state"]["outcome"] == "succeeded"

    def test_an_outage_past_the_budget_leaves_the_job_and_the_watch_goes_on(
        self, case: Case, clock: list[float]
    ) -> None:
        trigger = start(case, operator_for(case, "long"), TaskInstance())
        failing = _Failing(case.driver, failures=None)
        trigger._driver = failing  # type: ignore[assignment]
        began = clock[0]
        event = first_event(trigger)
        assert event["phase"] == WATCHING and event["reason"] == UNREACHABLE
        assert clock[0] - began == pytest.approx(case.driver.outage_budget_s)
        assert failing.reads > 3 and case.alive(trigger.ref)  # never cancelled for an outage
        assert event["kwargs"]["outage_since"] == began  # the next watch dates the outage on
        case.driver.cancel(trigger.ref)

    def test_a_pass_cancels_the_evaluation_of_a_higher_step(self, case: Case) -> None:
        ti = TaskInstance()
        higher = start(case, operator_for(case, "long", role="evaluate", label="eval-20"), ti)
        assert (
            case.driver.cancel_step(case.dag_id, case.run_id, case.run_dir, 21) is False
        )  # none runs
        assert case.driver.cancel_step(case.dag_id, case.run_id, case.run_dir, 20) is True
        assert not case.alive(higher.ref)
        assert case.driver.cancel_step(case.dag_id, case.run_id, case.run_dir, 20) is False

    def test_the_teardown_cancels_an_undecided_job_and_leaves_a_decided_one(
        self, case: Case
    ) -> None:
        ti = TaskInstance()
        trigger = start(case, operator_for(case, "long"), ti)
        teardown = CancelRecordedJobs(driver=case.driver, run_task_id="run")
        left = {**ti.xcoms[JOB_RECORD_KEY], "cancel": False, "why": "a watch error"}
        done = teardown.execute({"ti": SimpleNamespace(xcom_pull=lambda **kw: left, map_index=-1)})
        assert done == [{"job": case.driver.describe(trigger.ref), "cancelled": False}]
        assert case.alive(trigger.ref)  # a retry adopts it
        done = teardown.execute(context_of(case, ti))  # the task ended without deciding
        assert done == [{"job": case.driver.describe(trigger.ref), "cancelled": True}]
        assert not case.alive(trigger.ref)

    def test_on_kill_cancels_only_the_job_the_task_owns(self, case: Case) -> None:
        op = operator_for(case, "long")
        op.on_kill()  # nothing owned yet: nothing to cancel
        trigger = start(case, op, TaskInstance())
        assert case.alive(trigger.ref)
        op.on_kill()
        assert not case.alive(trigger.ref)

    def test_a_foreign_job_of_our_name_is_never_adopted_nor_cancelled(self, case: Case) -> None:
        op = operator_for(case, "long")
        request = op.request(context_of(case, TaskInstance()))
        foreign = case.foreign(request)
        trigger = start(case, op, TaskInstance(try_number=2))
        assert trigger.ref != foreign and case.alive(trigger.ref)
        assert case.driver.cancel(foreign) is False
        if case.foreign_visible:
            assert case.alive(foreign)
        case.driver.cancel(trigger.ref)
