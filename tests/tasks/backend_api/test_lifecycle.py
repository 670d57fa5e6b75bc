"""The cluster-job lifecycle every backend drives (tasks.backend_api.cluster_job, watch_trigger,
teardown, lifecycle_names, task_end): the names Airflow stores pinned, records read under one
key, and every backend's operators and triggers deriving from it."""

from __future__ import annotations

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
    assert (names.WATCHING, names.STOPPED, names.ERROR) == ("watching", "stopped", "error")
    assert (names.UNREACHABLE, names.STATE_CHANGED, names.STOP_REQUEST) == (
        "Unreachable", "StateChanged", "StopRequest",
    )  # fmt: skip
    assert names.JOBSET_TRIGGER == "tasks.backends.gke.triggers.JobSetTrigger"
    assert names.SLURM_TRIGGER == "tasks.backends.slurm.triggers.SlurmJobTrigger"
    assert names.LOCAL_TRIGGER == "tasks.backends.local_operators.LocalJobTrigger"
    assert names.STOP_GRACE.total_seconds() == 600.0
    assert names.eval_label(18) == "eval-18"
    from tasks.backend_api.task_end import TASK_ENDS
    from tasks.run.evaluation_end import STEP_CANCELS

    # what ends a task on the triggerer, by the name its trigger's kwargs give
    assert dict(TASK_ENDS) == {
        "job": "tasks.backend_api.task_end:_end_job",
        "evaluation": "tasks.run.evaluation_end:end_evaluation",
    }
    assert dict(STEP_CANCELS) == {
        "local": "tasks.backends.local_adapter:cancel_step",
        "slurm": "tasks.backends.slurm.triggers:cancel_step",
        "gke": "tasks.backends.gke.adapter:cancel_step",
    }


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


class _TI:
    """XComs of other task instances by key (`xcoms`), and what was pulled."""

    def __init__(self, xcoms: dict[str, Any]) -> None:
        self.xcoms, self.map_index, self.pulls = xcoms, 2, []

    def xcom_pull(self, *, task_ids: str, key: str, **where: Any) -> Any:
        self.pulls.append((key, where))
        return self.xcoms.get(key)


def test_the_records_are_read_under_one_key_for_one_instance_or_every_instance() -> None:
    gke = {"name": "js", "namespace": "ns", "cancel": False, "why": "adopted"}
    ti = _TI({"cluster_job": gke})
    assert recorded_jobs({"ti": ti}, "run", mapped=False) == [gke]  # type: ignore[typeddict-item]
    assert ti.pulls[0] == ("cluster_job", {"map_indexes": 2})
    slurm = [{"job_id": "7", "name": "n", "submit_time": 1, "cancel": None, "why": "running"}]
    ti = _TI({"cluster_job": slurm})
    assert recorded_jobs({"ti": ti}, "run", mapped=True) == slurm  # type: ignore[typeddict-item]
    assert ti.pulls[0] == ("cluster_job", {})  # every instance of a mapped task
    # a record the triggerer pushed with the task's end: Airflow 3.3.2 stores it JSON-encoded
    # twice, so it is read back as its JSON text
    ti = _TI({"cluster_job": [json.dumps(gke), slurm[0]]})
    assert recorded_jobs({"ti": ti}, "run", mapped=True) == [gke, slurm[0]]  # type: ignore[typeddict-item]
    ti = _TI({"cluster_job": json.dumps(gke)})
    assert recorded_jobs({"ti": ti}, "run", mapped=False) == [gke]  # type: ignore[typeddict-item]
    # a key of an unreleased earlier version is not read
    assert recorded_jobs({"ti": _TI({"jobset_ref": gke})}, "run", mapped=False) == []  # type: ignore[typeddict-item]


class _SlurmHook:
    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def job(self, job_id: str, expected: Any) -> Any:
        return SimpleNamespace(finished=False, state="RUNNING")

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)


def test_the_slurm_teardown_cancels_a_recorded_job_only_when_its_task_decided_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from tasks.backends.slurm import operators
    from tasks.backends.slurm.settings import SlurmSettings

    hook = _SlurmHook()
    monkeypatch.setattr(operators, "hook_for", lambda settings: hook)
    settings = SlurmSettings(working_dir=str(tmp_path), log_dir=str(tmp_path))
    recorded = {"job_id": "41", "name": "rcpflow-train-x", "submit_time": 5, "cancel": None,
              "why": "running"}  # fmt: skip
    teardown = operators.CancelSlurmJobsOperator(
        task_id="cleanup", run_task_id="run", settings=settings
    )
    done = teardown.execute({"ti": _TI({"cluster_job": recorded})})  # type: ignore[arg-type]
    assert done == [{"job_id": "41", "name": "rcpflow-train-x"}] and hook.cancelled == ["41"]
    left = {**recorded, "cancel": False, "why": "a watch error"}
    assert teardown.execute({"ti": _TI({"cluster_job": left})}) == []  # type: ignore[arg-type]
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


def test_a_watching_event_defers_again_and_a_stopped_one_ends_the_task_as_a_stop() -> None:
    op = _gke_op()
    kwargs = _jobset_trigger(import_string(names.JOBSET_TRIGGER)).kwargs()
    base = {"name": "js", "namespace": "default", "reason": "", "message": "", "progress": "p",
            "pods": [], "kwargs": None}  # fmt: skip
    ti = _PushTI()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete({"ti": ti}, {**base, "phase": names.WATCHING, "kwargs": kwargs})
    assert deferred.value.trigger.kwargs() == kwargs
    result = op.execute_complete({"ti": ti}, {**base, "phase": names.STOPPED})
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


@pytest.mark.parametrize(
    "classpath", [names.JOBSET_TRIGGER, names.SLURM_TRIGGER, names.LOCAL_TRIGGER]
)
def test_a_watch_moved_or_stopped_on_its_triggerer_cancels_no_job(classpath: str) -> None:
    """A trigger is cancelled when its triggerer stops or hands it to another (two triggerers,
    apache/airflow#73454 reports ``on_kill`` called on a reassignment): a watch owns no job,
    so neither ``cleanup`` nor ``on_kill`` cancels one. The job is cancelled only by the watch
    itself (a stop request's grace), by its operator's ``on_kill`` on a worker, or by the
    teardown (tests/airflow/distributed: the triggerer-lost fault)."""
    from airflow.triggers.base import BaseTrigger

    cls = import_string(classpath)
    assert cls.on_kill is BaseTrigger.on_kill and cls.cleanup is BaseTrigger.cleanup
