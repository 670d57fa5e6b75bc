"""The cluster-job lifecycle every backend drives (tasks.backend_api.cluster_job, watch_trigger,
teardown, lifecycle_names): the names Airflow stores pinned, every trigger classpath of an
earlier release resolving to the trigger that runs now, records and events of an earlier
release still understood, and every backend's operators and triggers deriving from it."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from airflow.sdk.module_loading import import_string

from tasks.backend_api import lifecycle_names as names
from tasks.backend_api.teardown import recorded_jobs


def test_names_that_outlive_a_process_keep_their_values() -> None:
    """Airflow's database (XComs, the trigger table, a task's next_kwargs) and the cluster (job
    names) hold these: a new value strands what an earlier release started."""
    assert names.JOB_RECORD_KEY == "cluster_job" and names.RECORD_DECISION == "cancel"
    assert dict(names.LEGACY_RECORD_KEYS) == {"jobset_ref": "delete", "slurm_job": "cancel"}
    assert (names.WATCHING, names.STOPPED, names.ERROR) == ("watching", "stopped", "error")
    assert dict(names.LEGACY_EVENT_NAMES) == {"Watching": "watching", "Stopped": "stopped"}
    assert (names.UNREACHABLE, names.STATE_CHANGED, names.STOP_REQUEST) == (
        "Unreachable", "StateChanged", "StopRequest",
    )  # fmt: skip
    assert names.JOBSET_TRIGGER == "tasks.backends.gke.triggers.JobSetTrigger"
    assert names.SLURM_TRIGGER == "tasks.backends.slurm.triggers.SlurmJobTrigger"
    assert names.LOCAL_TRIGGER == "tasks.backends.local_operators.LocalJobTrigger"
    assert dict(names.LEGACY_TRIGGER_CLASSPATHS) == {
        "plugins.jobset.JobSetTrigger": names.JOBSET_TRIGGER
    }
    assert names.STOP_GRACE.total_seconds() == 600.0
    assert names.eval_label(18) == "eval-18"
    assert names.event_phase("Watching") == "watching" and names.event_phase("x") == "x"


@pytest.mark.parametrize(
    "classpath", [names.JOBSET_TRIGGER, names.SLURM_TRIGGER, names.LOCAL_TRIGGER]
)
def test_each_trigger_serializes_under_its_pinned_classpath(classpath: str) -> None:
    from tasks.backend_api.watch_trigger import WatchTrigger

    cls = import_string(classpath)
    assert issubclass(cls, WatchTrigger)
    assert f"{cls.__module__}.{cls.__qualname__}" == classpath


def _jobset_trigger(cls: Any) -> Any:
    from tasks.backends.gke.settings import GkeSettings
    from tasks.backends.gke.triggers import cluster_kwargs

    cluster = cluster_kwargs(GkeSettings(use_dns_endpoint=True).cluster)
    return cls(name="js", namespace="default", cluster=cluster, poll_interval_s=0.0)


@pytest.mark.parametrize(("old", "new"), sorted(names.LEGACY_TRIGGER_CLASSPATHS.items()))
def test_an_old_trigger_classpath_deserialises_and_runs_the_new_trigger(
    old: str, new: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trigger row an earlier release stored: its classpath and JSON kwargs make the trigger
    of this release, which runs the shared watch loop."""
    from tasks.backends.gke.status import JobSetGone

    current = import_string(new)
    assert import_string(old) is current
    classpath, kwargs = _jobset_trigger(current).serialize()
    assert classpath == new
    restored = import_string(old)(**json.loads(json.dumps(kwargs)))
    assert restored.serialize() == (new, kwargs)

    async def gone(self: Any) -> dict[str, Any]:
        raise JobSetGone("JobSet default/js not found")

    monkeypatch.setattr(current, "read_jobset", gone)

    async def first() -> dict[str, Any]:
        async for event in restored.run():
            return dict(event.payload)
        raise AssertionError("no event")

    event = asyncio.run(asyncio.wait_for(first(), 30))
    assert (event["phase"], event["reason"]) == ("Failed", "NotFound")


class _TI:
    """XComs of other task instances by key (`xcoms`), and what was pulled."""

    def __init__(self, xcoms: dict[str, Any]) -> None:
        self.xcoms, self.map_index, self.pulls = xcoms, 2, []

    def xcom_pull(self, *, task_ids: str, key: str, **where: Any) -> Any:
        self.pulls.append((key, where))
        return self.xcoms.get(key)


def test_records_of_an_earlier_release_are_read_with_this_releases_decision() -> None:
    gke = {"name": "js", "namespace": "ns", "delete": False, "why": "adopted"}
    ti = _TI({"jobset_ref": gke})
    assert recorded_jobs({"ti": ti}, "run", mapped=False) == [  # type: ignore[typeddict-item]
        {"name": "js", "namespace": "ns", "cancel": False, "why": "adopted"}
    ]
    assert ti.pulls[0] == ("cluster_job", {"map_indexes": 2})
    slurm = [{"job_id": "7", "name": "n", "submit_time": 1, "cancel": None, "why": "running"}]
    ti = _TI({"slurm_job": slurm})
    assert recorded_jobs({"ti": ti}, "run", mapped=True) == slurm  # type: ignore[typeddict-item]
    assert ti.pulls[0] == ("cluster_job", {})  # every instance of a mapped task
    # this release's key first: a legacy record of an older try never overrides it
    new = {"name": "js", "namespace": "ns", "cancel": True, "why": "succeeded"}
    ti = _TI({"cluster_job": new, "jobset_ref": gke})
    assert recorded_jobs({"ti": ti}, "run", mapped=False) == [new]  # type: ignore[typeddict-item]


class _SlurmHook:
    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def job(self, job_id: str, expected: Any) -> Any:
        return SimpleNamespace(finished=False, state="RUNNING")

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)


def test_the_slurm_teardown_cancels_a_job_an_earlier_release_recorded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from tasks.backends.slurm import operators
    from tasks.backends.slurm.settings import SlurmSettings

    hook = _SlurmHook()
    monkeypatch.setattr(operators, "hook_for", lambda settings: hook)
    settings = SlurmSettings(working_dir=str(tmp_path), log_dir=str(tmp_path))
    legacy = {"job_id": "41", "name": "rcpflow-train-x", "submit_time": 5, "cancel": None,
              "why": "running"}  # fmt: skip
    teardown = operators.CancelSlurmJobsOperator(
        task_id="cleanup", run_task_id="run", settings=settings
    )
    done = teardown.execute({"ti": _TI({"slurm_job": legacy})})  # type: ignore[arg-type]
    assert done == [{"job_id": "41", "name": "rcpflow-train-x"}] and hook.cancelled == ["41"]
    left = {**legacy, "cancel": False, "why": "a watch error"}
    assert teardown.execute({"ti": _TI({"slurm_job": left})}) == []  # type: ignore[arg-type]
    assert hook.cancelled == ["41"]


def _gke_op() -> Any:
    from tasks.backends.gke.operators import RunJobSetOperator
    from tasks.backends.gke.settings import GkeSettings

    return RunJobSetOperator(
        task_id="run", settings=GkeSettings(use_dns_endpoint=True), role="train", job="train",
        command=["python"],
    )  # fmt: skip


class _PushTI:
    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def test_events_an_earlier_release_stored_are_understood() -> None:
    """A task resumed after an upgrade with an event its trigger fired before it: GKE's
    ``Watching`` defers again with its kwargs, ``Stopped`` ends the task as a stop."""
    op = _gke_op()
    kwargs = _jobset_trigger(import_string(names.JOBSET_TRIGGER)).kwargs()
    base = {"name": "js", "namespace": "default", "reason": "", "message": "", "progress": "p",
            "pods": [], "kwargs": None}  # fmt: skip
    ti = _PushTI()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete({"ti": ti}, {**base, "phase": "Watching", "kwargs": kwargs})
    assert deferred.value.trigger.kwargs() == kwargs
    result = op.execute_complete({"ti": ti}, {**base, "phase": "Stopped"})
    assert result["phase"] == "Stopped"
    assert ti.pushed[names.JOB_RECORD_KEY]["cancel"] is True


def test_on_kill_cancels_only_what_the_task_owns(monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.backends.gke import operators

    deleted: list[tuple[str, str]] = []
    hook = SimpleNamespace(delete_jobset=lambda ns, name: deleted.append((ns, name)) or True)
    monkeypatch.setattr(operators, "jobset_hook", lambda cluster: hook)
    op = _gke_op()
    op.on_kill()
    assert deleted == []
    with pytest.raises(TaskDeferred):
        op.watch({"name": "js", "namespace": "ns"}, _jobset_trigger(operators.JobSetTrigger))
    op.on_kill()
    assert deleted == [("ns", "js")]
