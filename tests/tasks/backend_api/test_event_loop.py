"""No trigger blocks the triggerer's event loop (every watch of every run shares it; a blocking
call in one delays all, apache/airflow#65945, #69841): the watch triggers of the three backends,
each ending its task on the triggerer, and 50 checkpoint waits resumed at once run in one loop,
and any callback that keeps the loop's thread busy for more than `SLOW_S` fails the test,
naming it. Measured as the loop thread's CPU time per callback (`time.thread_time`), not wall
time as asyncio's debug mode does: on 2 shared cores under the suite's load a callback's wall
time says more about the machine than about the trigger (asyncio's own check flagged a
0.05 s sleep as 0.68 s there). The clusters are stand-ins at the hook (an async read that
answers at once), so what is measured is the triggers' own work on the loop: imports, file
reads, the task's end; a wait on a network call is the hooks' (async, or in a thread)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from devtools.synthetic_run import make_run
from tasks.backend_api.task_end import TaskEndSpec

SLOW_S = 0.2
FIXTURES = Path(__file__).parents[1] / "backends" / "gke" / "fixtures"
# Every callback of the loop, timed by its thread's CPU time (see the module doc).
BUSY = """
import asyncio.events, time
slow = []
_run = asyncio.events.Handle._run
def _timed(self):
    start = time.thread_time()
    try:
        return _run(self)
    finally:
        spent = time.thread_time() - start
        if spent > %(slow)s:
            slow.append(f"{self!r} kept the loop busy {spent:.2f} s")
asyncio.events.Handle._run = _timed
"""
# A triggerer that starts (or restarts) a JobSet watch first: the trigger's module imported, the
# GKE driver's and its cluster client not yet. Its first read must import both off the loop.
FIRST_READ = """
import asyncio, sys
from tasks.backend_api.watch_trigger import WatchTrigger
assert "tasks.backends.gke.driver" not in sys.modules
args = {"namespace": "ns", "cluster": {
    "location": "l", "cluster_name": "c", "project_id": None, "gcp_conn_id": "g",
    "impersonation_chain": [], "use_internal_ip": False, "use_dns_endpoint": False,
    "kubernetes_conn_id": "k8s"}}
trigger = WatchTrigger(driver="gke", driver_args=args, ref={"name": "js", "namespace": "ns"},
                       poll_interval_s=1.0)
async def ticks():
    for _ in range(40):  # another watch of the loop, polling while the client is imported
        await asyncio.sleep(0.05)
async def first_read():
    driver = await trigger.job_driver()
    assert "tasks.backends.gke.hooks" not in sys.modules
    await driver._hook()
async def main():
    await asyncio.gather(first_read(), ticks())
asyncio.run(main())
assert "tasks.backends.gke.hooks" in sys.modules
print("SLOW", slow)
"""


class _FakeSlurm:
    def __init__(self, info: Any) -> None:
        self.info = info

    async def job(self, job_id: str, expected: Any = None) -> Any:
        return self.info

    async def read_output(self, path: str, offset: int) -> tuple[str, int]:
        return "", offset

    async def cancel(self, job_id: str, signal: str | None = None) -> None:
        return None


def _ti() -> Any:
    return SimpleNamespace(task_id="evaluation.evaluate")


def _local(tmp_path: Path, n: int) -> list[Any]:
    from tasks.backend_api.watch_trigger import WatchTrigger
    from tasks.backends.local import processes

    triggers = []
    for i in range(n):
        job = processes.start(tmp_path / f"j{i}", f"job {i}", [sys.executable, "-c", "0"])
        trigger = WatchTrigger(
            driver="local", driver_args={"jobs_root": str(tmp_path)}, ref=job.ref(),
            poll_interval_s=0.05, task_end=TaskEndSpec("job").kwargs(),
        )  # fmt: skip
        trigger.task_instance = _ti()
        triggers.append(trigger)
    return triggers


def _slurm() -> Any:
    from tasks.backend_api.watch_trigger import WatchTrigger
    from tasks.backends.slurm.driver import SlurmDriver
    from tasks.backends.slurm.hooks import JobInfo
    from tasks.backends.slurm.settings import SlurmSettings

    info = JobInfo(
        job_id="7", name="rcpflow-train-x", state="COMPLETED", reason="", exit_code=0,
        signal=None, submit_time=5, start_time=6, end_time=60, restarts=0, stdout_path="/o",
        nodes="n1", time_limit_s=900, source="squeue",
    )  # fmt: skip
    args = SlurmDriver(SlurmSettings(working_dir="/w", log_dir="/l")).args()
    trigger = WatchTrigger(
        driver="slurm", driver_args=args,
        ref={"job_id": "7", "name": "rcpflow-train-x", "submit_time": 5},
        poll_interval_s=0.05, settle_s=0.0, task_end=TaskEndSpec("job").kwargs(),
    )  # fmt: skip
    driver = SlurmDriver.from_args(args)  # as the trigger builds it (in a thread)
    driver._async_hook = _FakeSlurm(info)  # type: ignore[assignment]
    trigger._driver = driver
    trigger.task_instance = _ti()
    return trigger


class _FakeJobSets:
    def __init__(self, jobset: dict[str, Any]) -> None:
        self.jobset = jobset

    async def get_jobset(self, namespace: str, name: str) -> dict[str, Any]:
        return self.jobset


def _jobset(monkeypatch: pytest.MonkeyPatch) -> Any:
    from tasks.backend_api.watch_trigger import WatchTrigger
    from tasks.backends.gke.driver import GkeDriver
    from tasks.backends.gke.settings import GkeSettings

    succeeded = json.loads((FIXTURES / "status_succeeded.json").read_text())
    args = GkeDriver(GkeSettings(use_dns_endpoint=True, namespace="ns")).args()
    trigger = WatchTrigger(
        driver="gke", driver_args=args, ref={"name": "js", "namespace": "ns"},
        poll_interval_s=0.05, task_end=TaskEndSpec("job").kwargs(),
    )  # fmt: skip
    driver = GkeDriver.from_args(args)  # as the trigger builds it (in a thread)
    driver._async_hook = _FakeJobSets(succeeded)  # type: ignore[assignment]
    trigger._driver = driver
    trigger.task_instance = _ti()
    return trigger


def _waits(run_dir: str, steps: range) -> list[Any]:
    from tasks.run.triggers import CheckpointTrigger

    return [
        CheckpointTrigger(
            run_dir=run_dir,
            step=step,
            seed=1,
            dag_id="d",
            run_id="r",
            train_group_id="train",
            poll_interval_s=0.05,
            start_grace_s=60.0,
        )
        for step in steps
    ]


@pytest.mark.timeout(120)
def test_no_trigger_of_any_backend_blocks_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=67)  # rows 18..67, training ended
    triggers = [*_local(tmp_path, 5), _slurm(), _jobset(monkeypatch)]
    waits = _waits(run.run_dir, range(18, 68))

    async def first(trigger: Any) -> Any:
        async for event in trigger.run():
            return event
        raise AssertionError(f"{trigger!r} fired nothing")

    async def everything() -> list[Any]:
        return await asyncio.gather(*(first(t) for t in [*triggers, *waits]))

    scope: dict[str, Any] = {}
    exec(BUSY % {"slow": SLOW_S}, scope)  # the loop's callbacks timed, as in the subprocess
    try:
        events = asyncio.run(asyncio.wait_for(everything(), 100))
    finally:
        asyncio.events.Handle._run = scope["_run"]  # type: ignore[method-assign]
    assert scope["slow"] == [], "\n".join(scope["slow"])
    ended = events[: len(triggers)]
    assert all(type(e).__name__ == "TaskSuccessEvent" for e in ended), ended
    assert [e.payload["state"] for e in events[len(triggers) :]] == ["committed"] * 50


@pytest.mark.timeout(120)
def test_a_jobset_watchs_first_read_imports_the_cluster_client_off_the_loop() -> None:
    """Seconds of imports (kubernetes_asyncio, the providers) on the loop would stall every other
    watch of a freshly started triggerer."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-c", (BUSY + FIRST_READ) % {"slow": SLOW_S}],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SLOW []" in done.stdout, done.stdout[-3000:]
