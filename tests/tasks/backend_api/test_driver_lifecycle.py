"""The one job lifecycle's suite (`lifecycle_suite.LifecycleSuite`) against the in-memory fake
driver (fake_driver.py) and the local driver; the Slurm and GKE drivers run it against their
real servers (tests/tasks/backends/slurm/test_slurm_lifecycle.py,
tests/tasks/backends/gke/real/test_real_lifecycle.py). Here too: the restart budget, applied
once in the run operator, on the fake (a driver that restarts jobs)."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import fake_driver
import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from lifecycle_suite import (
    Case,
    LifecycleSuite,
    TaskInstance,
    context_of,
    operator_for,
    run_to_end,
    start,
    until_ended,
)

from tasks.backend_api import protocol, watch_trigger
from tasks.backend_api.protocol import JobRequest
from tasks.backends.local import processes
from tasks.backends.local.driver import LocalDriver


@pytest.fixture
def fake_cluster(monkeypatch: pytest.MonkeyPatch) -> fake_driver.FakeCluster:
    """The fake driver registered, on a cluster of its own."""
    monkeypatch.setattr(watch_trigger, "SETTLE_S", 0.0)
    monkeypatch.setitem(protocol._DRIVERS, "fake", fake_driver.FakeDriver)  # type: ignore[arg-type]
    cluster = fake_driver.FakeCluster()
    monkeypatch.setattr(fake_driver, "CLUSTER", cluster)
    return cluster


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
        real_time=False,
    )


class TestFakeDriver(LifecycleSuite):
    @pytest.fixture
    def case(self, tmp_path: Path, fake_cluster: fake_driver.FakeCluster) -> Case:
        return _fake_case(tmp_path)


_PROGRAMS = {
    "ok": "print('hello')",
    "fail": "import sys; print('bad'); sys.exit(3)",
    "long": "import time; time.sleep(120)",
}


class TestLocalDriver(LifecycleSuite):
    @pytest.fixture
    def case(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Case]:
        monkeypatch.setattr(watch_trigger, "SETTLE_S", 0.0)
        driver = LocalDriver(
            python=sys.executable, base_env={}, jobs_root=str(tmp_path / "jobs"),
            poll_interval_s=0.1,
        )  # fmt: skip
        run_dir, run_id = str(tmp_path / "run"), f"run-{uuid.uuid4().hex[:8]}"

        def foreign(request: JobRequest) -> Mapping[str, Any]:
            # a record in our job's folder naming a process that is not the job (a PID reused)
            folder = processes.job_folder(
                driver.jobs_root, request.dag_id, request.run_id, run_dir, request.label
            )
            folder.mkdir(parents=True, exist_ok=True)
            ref = {"name": "x", "pid": os.getpid(), "start": 1, "output": "/nonexistent",
                   "exit_path": "/nonexistent"}  # fmt: skip
            (folder / processes.RECORD_NAME).write_text(json.dumps(ref))
            return ref

        def alive(ref: Mapping[str, Any]) -> bool:
            return not processes.state(processes.LocalJob.from_ref(ref)).ended

        argv = {k: (sys.executable, "-c", p) for k, p in _PROGRAMS.items()}
        yield Case(driver, argv.__getitem__, alive, foreign, run_dir, run_id=run_id,
                   foreign_visible=False)  # fmt: skip
        for folder in Path(driver.jobs_root).glob("*/*"):  # every job of the test has ended
            job = processes.recorded(folder)
            assert job is None or job.pid == os.getpid() or processes.state(job).ended, job


def test_a_job_to_restart_starts_again_within_the_budget_then_fails_without_retries(
    fake_cluster: fake_driver.FakeCluster, tmp_path: Path
) -> None:
    """The restart policy is applied once, in the run operator, for a driver that restarts
    (the fake, with one restart; Slurm's tests run it on a real cluster)."""
    case = _fake_case(tmp_path)
    op, ti, event = run_to_end(case, "restart")
    assert event["state"]["outcome"] == "restart"
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete(context_of(case, ti), event)
    again = deferred.value.trigger
    assert again.ref != event["ref"] and again.budget == {"counted": 1, "uncounted": 0}
    assert len(fake_cluster.jobs) == 2
    event = until_ended(again)
    with pytest.raises(AirflowFailException, match="no restart left"):
        op.execute_complete(context_of(case, ti), event)
    assert len(fake_cluster.jobs) == 2


def test_a_cancel_the_cluster_does_not_answer_is_tried_again_at_the_next_poll(
    fake_cluster: fake_driver.FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the stop request's grace the watch cancels the job; a cluster that does not
    answer that call fails neither the watch nor the task: the next poll cancels again."""
    from types import SimpleNamespace

    from tasks.backend_api.lifecycle_names import STOPPED

    monkeypatch.setattr(watch_trigger, "current", lambda run_dir: SimpleNamespace(reason="x"))
    case = _fake_case(tmp_path)
    trigger = start(case, operator_for(case, "long"), TaskInstance())
    trigger.stop_grace_s = 0.0
    calls: list[int] = []
    cancel = fake_driver.FakeDriver.cancel

    def flaky(self: fake_driver.FakeDriver, ref: Mapping[str, Any]) -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("no answer")
        return cancel(self, ref)

    monkeypatch.setattr(fake_driver.FakeDriver, "cancel", flaky)
    event = until_ended(trigger)
    assert event["phase"] == STOPPED and len(calls) == 2 and not case.alive(trigger.ref)


def test_a_teardown_cancels_every_job_it_can_then_fails_naming_the_one_it_could_not(
    fake_cluster: fake_driver.FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from tasks.backend_api.teardown import CancelRecordedJobs

    case = _fake_case(tmp_path)
    first = start(case, operator_for(case, "long", label="eval-18"), TaskInstance())
    second = start(case, operator_for(case, "long", label="eval-19"), TaskInstance())
    cancel = fake_driver.FakeDriver.cancel

    def flaky(self: fake_driver.FakeDriver, ref: Mapping[str, Any]) -> bool:
        if ref["job_id"] == first.ref["job_id"]:
            raise ConnectionError("no answer")
        return cancel(self, ref)

    monkeypatch.setattr(fake_driver.FakeDriver, "cancel", flaky)
    records = [
        {**first.ref, "cancel": None, "why": "x"},
        {**second.ref, "cancel": None, "why": "x"},
    ]
    ti = SimpleNamespace(xcom_pull=lambda **kw: records, map_index=-1)
    teardown = CancelRecordedJobs(driver=case.driver, run_task_id="evaluate", mapped=True)
    with pytest.raises(RuntimeError, match=r"1 job\(s\) not cancelled: fake job 1: no answer"):
        teardown.execute({"ti": ti})
    assert case.alive(first.ref) and not case.alive(second.ref)
