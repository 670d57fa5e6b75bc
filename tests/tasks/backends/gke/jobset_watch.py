"""What the GKE driver's tests share (test_gke_driver.py, test_gke_watch_trouble.py): the
stand-in settings and JobSet, the run operator and its context, a watch driven to its events,
a scripted status source, and the watch loop's simulated clock."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from fake_task import FakeTI

from tasks.backend_api.job_state import JobState
from tasks.backend_api.lifecycle_names import ENDED, WATCHING
from tasks.backends.gke.driver import GkeDriver
from tasks.backends.gke.render import render_jobset
from tasks.backends.gke.settings import GkeSettings

SETTINGS = GkeSettings(use_dns_endpoint=True, poll_interval_s=0.01)
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"
DAG_ID, RUN_ID = "mlperf_grpo_run", "manual__2026-05-01T12:00:00+00:00"
REF = {"name": "js", "namespace": "default"}
# The watch's memo keys (`GkeDriver.submit_or_adopt`); a `_trigger` override of one goes there.
MEMO_KEYS = (
    "uid", "running_since", "suspended_since", "running_s", "submitted_at", "max_suspended_s",
    "max_running_s",
)  # fmt: skip


def _command(step: int = 18) -> list[str]:
    return ["python", "-m", "tpu_jobs.evaluate", "--run-dir", "gs://b/r", "--step", str(step)]


def _jobset(settings: GkeSettings = SETTINGS, step: int = 18) -> dict[str, Any]:
    return render_jobset(
        settings, role="evaluate", dag_id=DAG_ID, run_id=RUN_ID, job=f"eval-{step}",
        command=_command(step),
    )  # fmt: skip


def _op(settings: GkeSettings = SETTINGS, step: int = 18, **kwargs: Any) -> Any:
    from tasks.backend_api.job_operator import RunJobOperator

    return RunJobOperator(
        task_id="g.run", driver=GkeDriver(settings), role=kwargs.pop("role", "evaluate"),
        label=kwargs.pop("label", f"eval-{step}"), argv=kwargs.pop("argv", _command(step)),
        **kwargs,
    )  # fmt: skip


def _ctx(ti: FakeTI | None = None) -> dict[str, Any]:
    return {"ti": ti or FakeTI(), "dag_run": SimpleNamespace(dag_id=DAG_ID, run_id=RUN_ID)}


def _events(trigger: Any) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(asyncio.wait_for(collect(), timeout=60))


def _resolve(classpath: str) -> Any:
    """The class as the triggerer finds it (Airflow's own import_string)."""
    from airflow.sdk.module_loading import import_string

    return import_string(classpath)


def _restarted(trigger: Any) -> Any:
    """`trigger` as a (re)started triggerer makes it: from its classpath and kwargs in JSON."""
    classpath, kwargs = trigger.serialize()
    return _resolve(classpath)(**json.loads(json.dumps(kwargs)))


def _follow(trigger: Any) -> list[dict[str, Any]]:
    """Run `trigger`, and each trigger a watching event asks for (through JSON, like a
    re-defer), until an event that is not watching; every event in order."""
    from tasks.backend_api.watch_trigger import WatchTrigger

    seen: list[dict[str, Any]] = []
    while True:
        [event] = _events(trigger)
        seen.append(event)
        if event["phase"] != WATCHING:
            return seen
        trigger = _restarted(WatchTrigger(**event["kwargs"]))


def _finish(op: Any, ctx: dict[str, Any], trigger: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Drive a deferred operator as Airflow does: run its trigger, resume it with the event,
    and again while it defers; its result and the events."""
    from airflow.sdk.exceptions import TaskDeferred

    events = []
    while True:
        [event] = _events(_restarted(trigger))
        events.append(event)
        try:
            return op.execute_complete(ctx, event), events
        except TaskDeferred as deferred:
            trigger = deferred.trigger


def _trigger(**overrides: Any) -> Any:
    """A watch of JobSet default/js (seen running at the start, as the operator's read-back
    says); an override of a memo key (`MEMO_KEYS`) goes into the memo."""
    from tasks.backend_api.watch_trigger import WatchTrigger

    memo = {"running_since": 0.0}
    memo.update({k: overrides.pop(k) for k in MEMO_KEYS if k in overrides})
    kwargs = {
        "driver": "gke",
        "driver_args": GkeDriver(SETTINGS).args(),
        "ref": dict(REF),
        "poll_interval_s": 0.0,
        "outage_budget_s": 60.0,
        "memo": memo,
    }
    kwargs.update(overrides)
    return WatchTrigger(**kwargs)


def _state(event: dict[str, Any]) -> JobState:
    """The job state an ended event carries."""
    assert event["phase"] == ENDED, event
    return JobState.from_json(event["state"])


class _ScriptedHook:
    """The triggerer's JobSet hook, its reads scripted (`_scripted`)."""

    def __init__(self, responses: list[Any], reads: list[int], pods: dict[str, Any]) -> None:
        self.responses, self.reads, self.pods = responses, reads, pods

    async def get_jobset(self, namespace: str, name: str) -> dict[str, Any]:
        item = self.responses[min(len(self.reads), len(self.responses) - 1)]
        self.reads.append(1)
        if isinstance(item, BaseException):
            raise item
        return dict(item)

    async def list_jobset_pods(self, namespace: str, name: str) -> dict[str, Any]:
        return self.pods


def _scripted(
    monkeypatch: pytest.MonkeyPatch, responses: list[Any], pods: dict[str, Any] | None = None
) -> list[int]:
    """Make the GKE driver's watch read (or fail with) `responses` in order; returns a list
    that counts the reads."""
    reads: list[int] = []
    hook = _ScriptedHook(responses, reads, pods or {"items": []})

    async def scripted(self: GkeDriver) -> _ScriptedHook:
        return hook

    monkeypatch.setattr(GkeDriver, "_hook", scripted)
    return reads


class SimClock:
    """The watch loop's clock and sleep, simulated: a sleep advances the clock at once."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def _deferred_trigger(op: Any, ti: FakeTI | None = None) -> Any:
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferred:
        op.execute(_ctx(ti))
    return deferred.value.trigger
