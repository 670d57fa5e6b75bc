"""The one job lifecycle (tasks.backend_api: `RunJobOperator`, `WatchTrigger`,
`CancelRecordedJobs`), run against every driver the same way: an in-memory fake
(fake_driver.py) and the local driver here; the Slurm and GKE drivers run these steps against
their real servers in tests/tasks/backends/{slurm,gke} (`lifecycle_cases`). Covered: a start
recorded and watched; a worker lost after the submit and the retry adopting; ended ok, failed,
to restart; a stop request and its grace; an outage within and past the budget; the cancel of a
step after a pass; the teardown; ``on_kill``; a foreign job of our name never touched."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from tasks.backend_api import protocol, watch_trigger
from tasks.backend_api.job_operator import RunJobOperator
from tasks.backend_api.job_state import JobState
from tasks.backend_api.lifecycle_names import (
    ENDED,
    JOB_RECORD_KEY,
    STOPPED,
    UNREACHABLE,
    WATCHING,
)
from tasks.backend_api.protocol import JobDriver, JobRequest
from tasks.backend_api.teardown import CancelRecordedJobs
from tasks.backends.local import processes
from tasks.backends.local.driver import LocalDriver

sys.path.insert(0, str(Path(__file__).parent))
import fake_driver

DAG_ID, RUN_ID = "lifecycle", "run-1"


@dataclass
class Case:
    """A driver under test: its argv for a job that ends ok, fails or runs on (`argv`),
    whether a job still runs (`alive`), and a job of our name that is not ours (`foreign`)."""

    driver: JobDriver
    argv: Callable[[str], tuple[str, ...]]
    alive: Callable[[Mapping[str, Any]], bool]
    foreign: Callable[[JobRequest], Mapping[str, Any]]
    run_dir: str


def _fake_case(tmp_path: Path) -> Case:
    cluster = fake_driver.CLUSTER

    def foreign(request: JobRequest) -> Mapping[str, Any]:
        name = fake_driver.job_name(request.dag_id, request.run_id, request.label)
        return {"job_id": cluster.start(name, ("long",), owner="someone else").job_id}

    return Case(
        fake_driver.FakeDriver(),
        lambda kind: (kind,),
        lambda ref: not cluster.jobs[str(ref["job_id"])].state().ended,
        foreign,
        str(tmp_path / "run"),
    )


_PROGRAMS = {
    "ok": "print('hello')",
    "fail": "import sys; print('bad'); sys.exit(3)",
    "long": "import time; time.sleep(120)",
}


def _local_case(tmp_path: Path) -> Case:
    driver = LocalDriver(
        python=sys.executable, base_env={}, jobs_root=str(tmp_path / "jobs"), poll_interval_s=0.1
    )
    run_dir = str(tmp_path / "run")

    def foreign(request: JobRequest) -> Mapping[str, Any]:
        # a record of our job's folder naming a process that is not the job (a PID reused)
        folder = processes.job_folder(driver.jobs_root, DAG_ID, RUN_ID, run_dir, request.label)
        folder.mkdir(parents=True, exist_ok=True)
        ref = {"name": "x", "pid": os.getpid(), "start": 1, "output": "/nonexistent",
               "exit_path": "/nonexistent"}  # fmt: skip
        (folder / processes.RECORD_NAME).write_text(json.dumps(ref))
        return ref

    def alive(ref: Mapping[str, Any]) -> bool:
        return not processes.state(processes.LocalJob.from_ref(ref)).ended

    return Case(driver, lambda kind: (sys.executable, "-c", _PROGRAMS[kind]), alive, foreign,
                run_dir)  # fmt: skip


CASES = {"fake": _fake_case, "local": _local_case}


@pytest.fixture(params=sorted(CASES))
def case(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Case]:
    monkeypatch.setattr(watch_trigger, "SETTLE_S", 0.0)
    monkeypatch.setitem(protocol._DRIVERS, "fake", fake_driver.FakeDriver)  # type: ignore[arg-type]
    monkeypatch.setattr(fake_driver, "CLUSTER", fake_driver.FakeCluster())
    found = CASES[request.param](tmp_path)
    yield found
    for job in processes.DEFAULT_JOBS_ROOT.glob("never"):  # nothing of ours goes there
        raise AssertionError(job)


class _TI:
    def __init__(self, try_number: int = 1) -> None:
        self.task_id, self.map_index, self.try_number = "train.job.run", -1, try_number
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value

    def xcom_pull(self, *, task_ids: str, key: str, **where: Any) -> Any:
        return self.xcoms.get(key)


def _context(ti: _TI) -> Any:
    return {"ti": ti, "dag_run": SimpleNamespace(dag_id=DAG_ID, run_id=RUN_ID)}


def _operator(case: Case, kind: str, role: str = "train", label: str = "train") -> RunJobOperator:
    return RunJobOperator(
        task_id="run", driver=case.driver, role=role, label=label,  # type: ignore[arg-type]
        argv=list(case.argv(kind)), run_dir=case.run_dir, stop_run_dir=case.run_dir,
    )  # fmt: skip


def _start(op: RunJobOperator, ti: _TI) -> watch_trigger.WatchTrigger:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(_context(ti))
    trigger = deferred.value.trigger
    assert isinstance(trigger, watch_trigger.WatchTrigger)
    return trigger


def _event(trigger: watch_trigger.WatchTrigger) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the watch ended without an event")

    return asyncio.run(asyncio.wait_for(first(), timeout=60))


def _until_ended(trigger: watch_trigger.WatchTrigger) -> dict[str, Any]:
    """The watch's events, deferring again on each WATCHING one, until the job's end."""
    for _ in range(20):
        event = _event(trigger)
        if event["phase"] != WATCHING:
            return event
        trigger = watch_trigger.WatchTrigger(**event["kwargs"])
    raise AssertionError("the job never ended")


def test_a_job_starts_recorded_and_watched_through_its_driver(case: Case) -> None:
    ti = _TI()
    trigger = _start(_operator(case, "long"), ti)
    record = ti.xcoms[JOB_RECORD_KEY]
    assert record["cancel"] is None and record["why"] == "running"
    kwargs = trigger.kwargs()
    assert kwargs["driver"] == case.driver.name and kwargs["driver_args"] == case.driver.args()
    ref = {k: v for k, v in record.items() if k not in ("cancel", "why")}
    assert kwargs["ref"] == ref and case.alive(ref)
    json.dumps(kwargs)  # the whole watch is JSON (Airflow stores it)
    case.driver.cancel(ref)


def test_a_retry_adopts_the_job_an_earlier_try_left_running(case: Case) -> None:
    first = _start(_operator(case, "long"), _TI())
    again = _start(_operator(case, "long"), _TI(try_number=2))
    assert again.ref == first.ref  # the worker was lost after the submit: one job, adopted
    assert case.alive(first.ref)
    case.driver.cancel(first.ref)


def test_a_job_that_ends_ok_succeeds_its_task_and_is_recorded_for_the_teardown(
    case: Case,
) -> None:
    ti = _TI()
    op = _operator(case, "ok")
    event = _until_ended(_start(op, ti))
    assert event["phase"] == ENDED and event["state"]["outcome"] == "succeeded"
    result = op.execute_complete(_context(ti), event)
    assert result["outcome"] == "succeeded" and result["exit_code"] == 0
    assert ti.xcoms[JOB_RECORD_KEY]["cancel"] is True


def test_a_job_that_fails_fails_its_task_naming_it_and_quoting_its_output(case: Case) -> None:
    ti = _TI()
    op = _operator(case, "fail")
    event = _until_ended(_start(op, ti))
    assert event["state"]["outcome"] == "failed"
    with pytest.raises(AirflowException) as failed:
        op.execute_complete(_context(ti), event)
    assert not isinstance(failed.value, AirflowFailException)  # a retry runs it again
    message = str(failed.value)
    assert message.startswith(case.driver.describe(event["ref"]))
    assert "last output lines" in message


def test_a_job_to_restart_starts_again_within_the_budget_then_fails_without_retries(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The restart policy is applied once, in the run operator, for a driver that restarts
    (the fake, with one restart; Slurm's tests run it on a real cluster)."""
    monkeypatch.setattr(watch_trigger, "SETTLE_S", 0.0)
    monkeypatch.setitem(protocol._DRIVERS, "fake", fake_driver.FakeDriver)  # type: ignore[arg-type]
    monkeypatch.setattr(fake_driver, "CLUSTER", fake_driver.FakeCluster())
    case, ti = _fake_case(tmp_path), _TI()
    op = _operator(case, "restart")
    event = _until_ended(_start(op, ti))
    assert event["state"]["outcome"] == "restart"
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete(_context(ti), event)
    again = deferred.value.trigger
    assert again.ref != event["ref"] and again.budget == {"counted": 1, "uncounted": 0}
    assert len(fake_driver.CLUSTER.jobs) == 2
    event = _until_ended(again)
    with pytest.raises(AirflowFailException, match="no restart left"):
        op.execute_complete(_context(ti), event)
    assert len(fake_driver.CLUSTER.jobs) == 2


def test_a_stop_request_cancels_the_job_after_its_grace(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    requested = SimpleNamespace(reason="the run passed at step 19")
    monkeypatch.setattr(watch_trigger, "current", lambda run_dir: requested)
    ti = _TI()
    op = _operator(case, "long")
    trigger = _start(op, ti)
    trigger.stop_grace_s = 0.0
    assert trigger.stop_run_dir == case.run_dir
    event = _event(trigger)
    assert event["phase"] == STOPPED and not case.alive(trigger.ref)
    result = op.execute_complete(_context(ti), event)
    assert result["outcome"] == "stopped" and ti.xcoms[JOB_RECORD_KEY]["cancel"] is True


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


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The watch's simulated clock: sleeping moves it, nothing waits."""
    now = [1_000_000.0]

    async def sleep(seconds: float) -> None:
        now[0] += seconds
        await asyncio.sleep(0)

    monkeypatch.setattr(watch_trigger, "_now", lambda: now[0])
    monkeypatch.setattr(watch_trigger, "_sleep", sleep)
    return now


def test_an_outage_within_the_budget_is_ridden_out(case: Case, clock: list[float]) -> None:
    ti = _TI()
    op = _operator(case, "ok")
    trigger = _start(op, ti)
    trigger._driver = _Failing(case.driver, failures=3)  # type: ignore[assignment]
    if isinstance(case.driver, LocalDriver):  # the job's own time is real: let it end first
        while case.alive(trigger.ref):
            asyncio.run(asyncio.sleep(0.05))
    event = _until_ended(trigger)
    assert event["state"]["outcome"] == "succeeded"


def test_an_outage_past_the_budget_leaves_the_job_and_the_watch_goes_on(
    case: Case, clock: list[float]
) -> None:
    trigger = _start(_operator(case, "long"), _TI())
    failing = _Failing(case.driver, failures=None)
    trigger._driver = failing  # type: ignore[assignment]
    start = clock[0]
    event = _event(trigger)
    assert event["phase"] == WATCHING and event["reason"] == UNREACHABLE
    assert clock[0] - start == pytest.approx(case.driver.outage_budget_s)
    assert failing.reads > 3 and case.alive(trigger.ref)  # never cancelled for an outage
    assert event["kwargs"]["outage_since"] == start  # the next watch dates the outage on
    case.driver.cancel(trigger.ref)


def test_a_pass_cancels_the_evaluation_of_a_higher_step(case: Case) -> None:
    ti = _TI()
    higher = _start(_operator(case, "long", role="evaluate", label="eval-20"), ti)
    assert case.driver.cancel_step(DAG_ID, RUN_ID, case.run_dir, 21) is False  # none runs
    assert case.driver.cancel_step(DAG_ID, RUN_ID, case.run_dir, 20) is True
    assert not case.alive(higher.ref)
    assert case.driver.cancel_step(DAG_ID, RUN_ID, case.run_dir, 20) is False


def test_the_teardown_cancels_an_undecided_job_and_leaves_a_decided_one(case: Case) -> None:
    ti = _TI()
    trigger = _start(_operator(case, "long"), ti)
    teardown = CancelRecordedJobs(driver=case.driver, run_task_id="run")
    left = {**ti.xcoms[JOB_RECORD_KEY], "cancel": False, "why": "a watch error"}
    done = teardown.execute({"ti": SimpleNamespace(xcom_pull=lambda **kw: left, map_index=-1)})
    assert done == [{"job": case.driver.describe(trigger.ref), "cancelled": False}]
    assert case.alive(trigger.ref)  # a retry adopts it
    done = teardown.execute(_context(ti))  # the task ended without deciding
    assert done == [{"job": case.driver.describe(trigger.ref), "cancelled": True}]
    assert not case.alive(trigger.ref)


def test_on_kill_cancels_only_the_job_the_task_owns(case: Case) -> None:
    op = _operator(case, "long")
    op.on_kill()  # nothing owned yet: nothing to cancel
    trigger = _start(op, _TI())
    assert case.alive(trigger.ref)
    op.on_kill()
    assert not case.alive(trigger.ref)


def test_a_foreign_job_of_our_name_is_never_adopted_nor_cancelled(case: Case) -> None:
    op = _operator(case, "long")
    request = op.request(_context(_TI()))
    foreign = case.foreign(request)
    trigger = _start(op, _TI(try_number=2))
    assert trigger.ref != foreign and case.alive(trigger.ref)
    assert case.driver.cancel(foreign) is False
    if isinstance(case.driver, fake_driver.FakeDriver):
        assert case.alive(foreign)
    case.driver.cancel(trigger.ref)
