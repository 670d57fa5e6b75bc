"""The job lifecycle every driver runs under (tasks.backend_api: job_operator, watch_trigger,
teardown, lifecycle_names, task_end, protocol): the names Airflow stores pinned, records read
under one key, and no backend holding a lifecycle class of its own."""

from __future__ import annotations

import json
from typing import Any

import pytest
from airflow.sdk.module_loading import import_string

from tasks.backend_api import lifecycle_names as names
from tasks.backend_api.teardown import recorded_jobs


def test_names_that_outlive_a_process_keep_their_values() -> None:
    """Airflow's database (XComs, the trigger table, a task's next_kwargs) and the cluster (job
    names) hold these: a new value strands what an earlier release started. (rcpflow has had
    no release: the per-backend trigger classpaths of earlier versions are gone.)"""
    assert names.JOB_RECORD_KEY == "cluster_job" and names.RECORD_DECISION == "cancel"
    assert (names.WATCHING, names.STOPPED, names.ENDED) == ("watching", "stopped", "ended")
    assert (names.UNREACHABLE, names.STATE_CHANGED, names.STOP_REQUEST) == (
        "Unreachable", "StateChanged", "StopRequest",
    )  # fmt: skip
    assert names.WATCH_TRIGGER == "tasks.backend_api.watch_trigger.WatchTrigger"
    assert names.STOP_GRACE.total_seconds() == 600.0
    assert names.eval_label(18) == "eval-18"
    from tasks.backend_api.protocol import DRIVER_MODULES
    from tasks.backend_api.task_end import TASK_ENDS

    # what ends a task on the triggerer, by the name its trigger's kwargs give
    assert dict(TASK_ENDS) == {
        "job": "tasks.backend_api.task_end:_end_job",
        "evaluation": "tasks.run.evaluation_end:end_evaluation",
    }
    # the drivers a trigger names, and the modules the triggerer imports for them
    assert dict(DRIVER_MODULES) == {
        "local": "tasks.backends.local.driver",
        "slurm": "tasks.backends.slurm.driver",
        "gke": "tasks.backends.gke.driver",
    }


def test_the_trigger_serializes_under_its_pinned_classpath_and_each_driver_under_its_name() -> None:
    from tasks.backend_api.protocol import DRIVER_MODULES, driver_type
    from tasks.backend_api.watch_trigger import WatchTrigger

    cls = import_string(names.WATCH_TRIGGER)
    assert cls is WatchTrigger
    trigger = WatchTrigger(
        driver="local", driver_args={"jobs_root": "/x"}, ref={"name": "j"}, poll_interval_s=1
    )
    assert trigger.serialize()[0] == names.WATCH_TRIGGER
    for name, module in DRIVER_MODULES.items():
        found = driver_type(name)
        assert (found.name, found.__module__) == (name, module)
    with pytest.raises(LookupError, match="'nosuch' is not registered"):
        driver_type("nosuch")


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


def test_a_watch_moved_or_stopped_on_its_triggerer_cancels_no_job() -> None:
    """A trigger is cancelled when its triggerer stops or hands it to another (two triggerers,
    apache/airflow#73454 reports ``on_kill`` called on a reassignment): a watch owns no job,
    so neither ``cleanup`` nor ``on_kill`` cancels one. The job is cancelled only by the watch
    itself (a stop request's grace), by its operator's ``on_kill`` on a worker, or by the
    teardown (tests/airflow/distributed: the triggerer-lost fault)."""
    from airflow.triggers.base import BaseTrigger

    cls = import_string(names.WATCH_TRIGGER)
    assert cls.on_kill is BaseTrigger.on_kill and cls.cleanup is BaseTrigger.cleanup


def test_no_backend_holds_a_lifecycle_class_of_its_own() -> None:
    """A backend is a driver, composed into the one lifecycle: no class under tasks/backends
    is an operator or a trigger (drivers are composed, not inherited)."""
    import inspect
    import pkgutil

    from airflow.sdk import BaseOperator
    from airflow.triggers.base import BaseTrigger

    import tasks.backends

    found = []
    for info in pkgutil.walk_packages(tasks.backends.__path__, "tasks.backends."):
        module = __import__(info.name, fromlist=["_"])
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == info.name and issubclass(obj, BaseOperator | BaseTrigger):
                found.append(f"{info.name}.{obj.__name__}")
    assert found == []
