"""tasks.backends.gke operators and trigger: the trigger's status handling, its classpaths, and
the operators driving the Google provider's real GKE operators and hooks against a stand-in
Kubernetes API (`fake_gke`: only the cluster lookup and the Google credentials are replaced)."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any
from urllib.parse import unquote

import pytest

from tasks.backends.gke.render import render_jobset
from tasks.backends.gke.settings import GkeSettings

SETTINGS = GkeSettings(use_dns_endpoint=True, poll_interval_s=0.01)
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"


def _jobset(settings: GkeSettings = SETTINGS, step: int = 18) -> dict[str, Any]:
    return render_jobset(
        settings,
        role="evaluate",
        dag_id="mlperf_grpo_run",
        run_id="manual__2026-05-01T12:00:00+00:00",
        job=f"eval-{step}",
        command=["python", "-m", "tpu_jobs.evaluate", "--run-dir", "gs://b/r", "--step", str(step)],
    )


class FakeTI:
    """The part of a running task instance the operators use: XCom push/pull, map index."""

    def __init__(self, map_index: int = -1, xcoms: dict | None = None) -> None:
        self.map_index = map_index
        self.pushed: dict[str, Any] = {}
        self.xcoms = xcoms or {}
        self.pulls: list[tuple] = []

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def xcom_pull(self, *, task_ids: str, key: str, map_indexes: int) -> Any:
        self.pulls.append((task_ids, key, map_indexes))
        return self.xcoms.get((task_ids, key, map_indexes))


def _events(trigger) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(asyncio.wait_for(collect(), timeout=60))


def _trigger(**overrides: Any):
    from tasks.backends.gke.triggers import JobSetTrigger

    kwargs = {
        "name": "js",
        "namespace": "default",
        "cluster_url": "http://127.0.0.1:1",
        "ssl_ca_cert": "",
        "use_dns_endpoint": True,
        "poll_interval_s": 0.0,
        "api_error_budget_s": 60.0,
    }
    kwargs.update(overrides)
    return JobSetTrigger(**kwargs)


def _scripted(monkeypatch: pytest.MonkeyPatch, responses: list[Any]) -> list[int]:
    """Make JobSetTrigger.read_jobset return (or raise) `responses` in order; returns a list
    that counts the reads."""
    from tasks.backends.gke.triggers import JobSetTrigger

    reads: list[int] = []

    async def read_jobset(self) -> dict[str, Any]:
        item = responses[min(len(reads), len(responses) - 1)]
        reads.append(1)
        if isinstance(item, BaseException):
            raise item
        return item

    monkeypatch.setattr(JobSetTrigger, "read_jobset", read_jobset)
    return reads


# --- trigger: status handling with a scripted status source --------------------------------


def test_trigger_waits_through_running_and_suspended(monkeypatch, recorded_status) -> None:
    reads = _scripted(
        monkeypatch,
        [
            recorded_status("status_created.json"),
            recorded_status("status_suspended.json"),
            recorded_status("status_running.json"),
            recorded_status("status_restarting.json"),
            recorded_status("status_succeeded.json"),
        ],
    )
    [event] = _events(_trigger())
    assert len(reads) == 5
    assert event["phase"] == "Succeeded"
    assert "16 succeeded" in event["progress"]


@pytest.mark.parametrize(
    ("fixture", "reason"),
    [
        ("status_failed_max_restarts.json", "ReachedMaxRestarts"),
        ("status_failed_jobs.json", "FailedJobs"),
    ],
)
def test_trigger_reports_failure_with_reason(monkeypatch, recorded_status, fixture, reason) -> None:
    _scripted(monkeypatch, [recorded_status("status_running.json"), recorded_status(fixture)])
    [event] = _events(_trigger())
    assert (event["phase"], event["reason"]) == ("Failed", reason)
    assert "first failed job" in event["message"]


class SimClock:
    """The watch loop's clock and sleep, simulated: a sleep advances the clock at once."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


@pytest.fixture
def sim_clock(monkeypatch: pytest.MonkeyPatch) -> SimClock:
    from tasks.backends.gke import triggers

    clock = SimClock()
    monkeypatch.setattr(triggers, "_monotonic", clock.monotonic)
    monkeypatch.setattr(triggers, "_sleep", clock.sleep)
    return clock


def test_trigger_rides_out_a_few_read_errors(monkeypatch, recorded_status, sim_clock) -> None:
    reads = _scripted(
        monkeypatch,
        [
            ConnectionResetError("reset"),
            TimeoutError("slow apiserver"),
            recorded_status("status_running.json"),
            ConnectionResetError("reset"),
            recorded_status("status_succeeded.json"),
        ],
    )
    [event] = _events(_trigger(poll_interval_s=30.0, api_error_budget_s=1200.0))
    assert event["phase"] == "Succeeded" and len(reads) == 5
    # backoff doubles from the poll interval and starts afresh after a good read
    assert sim_clock.sleeps == [30.0, 60.0, 30.0, 30.0]


def test_trigger_gives_up_when_errors_outlast_the_budget(monkeypatch, sim_clock) -> None:
    reads = _scripted(monkeypatch, [PermissionError("403 Forbidden")])
    [event] = _events(_trigger(poll_interval_s=10.0, api_error_budget_s=300.0))
    assert event["phase"] == "error"
    assert sim_clock.now == 300.0  # gives up at the budget, not before and not a backoff later
    assert sim_clock.sleeps == [10.0, 20.0, 40.0, 80.0, 120.0, 30.0]  # capped at 120 s
    assert len(reads) == 7
    assert "7 reads in a row over 300s (budget 300s)" in event["message"]
    assert "403 Forbidden" in event["message"]


def test_trigger_deleted_jobset_and_malformed_status(monkeypatch, recorded_status) -> None:
    from tasks.backends.gke.triggers import JobSetGone

    _scripted(monkeypatch, [JobSetGone("JobSet default/js not found")])
    [event] = _events(_trigger())
    assert (event["phase"], event["reason"]) == ("Failed", "NotFound")

    _scripted(monkeypatch, [recorded_status("status_contradictory.json")])
    [event] = _events(_trigger())
    assert event["phase"] == "error" and "contradictory" in event["message"]


def test_trigger_serializes_to_an_importable_classpath() -> None:
    trigger = _trigger(impersonation_chain=["sa@p.iam.gserviceaccount.com"])
    classpath, kwargs = trigger.serialize()
    assert classpath == "tasks.backends.gke.triggers.JobSetTrigger"
    json.dumps(kwargs)  # what the triggerer stores must be JSON
    again = _resolve(classpath)(**kwargs)
    assert again.serialize() == (classpath, kwargs)


def test_the_classpath_of_earlier_releases_still_resolves() -> None:
    # A task deferred before the move has "plugins.jobset.JobSetTrigger" in the trigger table.
    from tasks.backends.gke.triggers import JobSetTrigger

    old = _resolve("plugins.jobset.JobSetTrigger")
    assert old is JobSetTrigger
    _classpath, kwargs = _trigger().serialize()
    assert old(**kwargs).serialize() == _trigger().serialize()


def _resolve(classpath: str) -> Any:
    """The class as the triggerer finds it (Airflow's own import_string)."""
    from airflow.sdk.module_loading import import_string

    return import_string(classpath)


# --- operators, without a cluster ----------------------------------------------------------


def test_execute_complete_maps_events_to_task_outcomes() -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from tasks.backends.gke.operators import RunJobSetOperator

    op = RunJobSetOperator(task_id="run", jobset=_jobset(), cluster=SETTINGS.cluster)
    base = {
        "name": "js",
        "namespace": "default",
        "reason": "",
        "message": "",
        "progress": "p",
        "pods": [],
    }
    done = op.execute_complete({}, {**base, "phase": "Succeeded"})
    assert done == {"name": "js", "namespace": "default", "phase": "Succeeded", "progress": "p"}

    failed = {**base, "phase": "Failed", "reason": "ReachedMaxRestarts", "message": "m"}
    with pytest.raises(AirflowFailException, match=r"default/js failed \(ReachedMaxRestarts\): m"):
        op.execute_complete({}, failed)

    with pytest.raises(AirflowException, match="could not follow") as excinfo:
        op.execute_complete({}, {**base, "phase": "error", "message": "3 reads in a row failed"})
    assert not isinstance(excinfo.value, AirflowFailException)  # retryable


def test_a_bad_jobset_is_refused_before_anything_is_recorded() -> None:
    from tasks.backends.gke.operators import RunJobSetOperator

    bad = _jobset()
    del bad["metadata"]["namespace"]
    ti = FakeTI()
    op = RunJobSetOperator(task_id="run", jobset=bad, cluster=SETTINGS.cluster)
    with pytest.raises(ValueError, match=r"metadata\.namespace"):
        op.execute({"ti": ti})
    assert ti.pushed == {}


def test_cleanup_without_a_recorded_jobset_does_nothing(fake_gke) -> None:
    from tasks.backends.gke.operators import DeleteJobSetOperator

    op = DeleteJobSetOperator(task_id="cleanup", run_task_id="g.run", cluster=SETTINGS.cluster)
    ti = FakeTI(map_index=3)
    assert op.execute({"ti": ti}) is None
    assert ti.pulls == [("g.run", "jobset_ref", 3)]
    assert fake_gke.requests == []


# --- operators and trigger through the provider's GKE operators/hooks ----------------------


def test_run_creates_defers_and_follows_to_success(fake_gke, recorded_status) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from tasks.backends.gke.operators import RunJobSetOperator

    jobset = _jobset()
    name = jobset["metadata"]["name"]
    fake_gke.statuses = [
        recorded_status("status_running.json")["status"],
        recorded_status("status_succeeded.json")["status"],
    ]
    op = RunJobSetOperator(task_id="g.run", jobset=jobset, cluster=SETTINGS.cluster)
    ti = FakeTI()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})

    assert ti.pushed == {"jobset_ref": {"name": name, "namespace": "default"}}
    assert fake_gke.requests[0] == ("POST", JOBSETS, "Bearer test-token")
    assert fake_gke.objects[("default", name)] == jobset  # the rendered object, unchanged
    assert deferred.value.method_name == "execute_complete"
    trigger = deferred.value.trigger
    assert (trigger.name, trigger.cluster_url) == (name, fake_gke.url)

    gets_before = fake_gke.methods().count("GET")
    [event] = _events(trigger)  # kubernetes_asyncio through GKEKubernetesAsyncHook
    assert fake_gke.methods().count("GET") > gets_before
    assert op.execute_complete({"ti": ti}, event)["phase"] == "Succeeded"


def test_run_retry_adopts_its_own_jobset_and_refuses_a_foreign_one(fake_gke) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from tasks.backends.gke.operators import RunJobSetOperator
    from tasks.backends.gke.render import JobSetConflictError

    jobset = _jobset()
    op = RunJobSetOperator(task_id="g.run", jobset=jobset, cluster=SETTINGS.cluster)
    for _ in range(2):  # the second try finds the JobSet of the first (409) and follows it
        with pytest.raises(TaskDeferred):
            op.execute({"ti": FakeTI()})
    assert len(fake_gke.objects) == 1
    assert fake_gke.methods().count("POST") >= 2

    other = _jobset(GkeSettings(use_dns_endpoint=True, image="rcpflow-tpu:other"))
    assert other["metadata"]["name"] == jobset["metadata"]["name"]
    op = RunJobSetOperator(task_id="g.run", jobset=other, cluster=SETTINGS.cluster)
    with pytest.raises(JobSetConflictError, match="not rendered from this spec"):
        op.execute({"ti": FakeTI()})


def test_run_never_defers_on_a_jobset_the_cluster_does_not_have(fake_gke) -> None:
    from airflow.sdk.exceptions import AirflowException, TaskDeferred

    from tasks.backends.gke.operators import RunJobSetOperator

    jobset = _jobset()
    fake_gke.fail_posts = [503]  # the create fails and the apiserver did not apply it
    op = RunJobSetOperator(task_id="g.run", jobset=jobset, cluster=SETTINGS.cluster)
    with pytest.raises(AirflowException, match=r"not on the cluster after the create call fa"):
        op.execute({"ti": FakeTI()})
    assert fake_gke.objects == {}
    assert fake_gke.methods() == ["POST", "GET"]  # one create, then the read that tells
    with pytest.raises(TaskDeferred):
        op.execute({"ti": FakeTI()})  # what Airflow's retry does: now it is created
    assert ("default", jobset["metadata"]["name"]) in fake_gke.objects


def test_trigger_on_a_deleted_jobset_fails_it(fake_gke) -> None:
    [event] = _events(
        _trigger(cluster_url=fake_gke.url, name="gone", poll_interval_s=0.01)
    )  # GET -> 404
    assert (event["phase"], event["reason"]) == ("Failed", "NotFound")


def test_cleanup_deletes_the_recorded_jobset_and_tolerates_absence(fake_gke) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from tasks.backends.gke.operators import DeleteJobSetOperator, RunJobSetOperator

    jobset = _jobset()
    ti = FakeTI(map_index=2)
    run = RunJobSetOperator(task_id="g.run", jobset=jobset, cluster=SETTINGS.cluster)
    with pytest.raises(TaskDeferred):
        run.execute({"ti": ti})
    ref = ti.pushed["jobset_ref"]
    ti.xcoms[("g.run", "jobset_ref", 2)] = ref

    cleanup = DeleteJobSetOperator(
        task_id="g.cleanup", run_task_id="g.run", cluster=SETTINGS.cluster
    )
    assert cleanup.execute({"ti": ti}) == {**ref, "deleted": True}
    assert fake_gke.objects == {}
    assert fake_gke.requests[-1] == ("DELETE", f"{JOBSETS}/{ref['name']}", "Bearer test-token")
    assert cleanup.execute({"ti": ti}) == {**ref, "deleted": False}  # already gone: fine


# --- watch under API trouble, retries that adopt, failures with pod detail ------------------

REAL_WATCH = GkeSettings(use_dns_endpoint=True)  # the default watch: 30 s polls, 20 min budget


def _deferred_trigger(op: Any, ti: FakeTI | None = None) -> Any:
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti or FakeTI()})
    return deferred.value.trigger


def _run_op(jobset: dict[str, Any], settings: GkeSettings = REAL_WATCH) -> Any:
    from tasks.backends.gke.operators import RunJobSetOperator

    return RunJobSetOperator(
        task_id="g.run",
        jobset=jobset,
        cluster=settings.cluster,
        **settings.watch_kwargs(),
    )


def test_the_watch_survives_a_ten_minute_api_outage(fake_gke, recorded_status, sim_clock) -> None:
    # Every read of the (real) trigger through the provider's async hook gets 503 for ten
    # simulated minutes; the JobSet meanwhile finishes. The default budget rides it out.
    fake_gke.statuses = [recorded_status("status_succeeded.json")["status"]]
    op = _run_op(_jobset())
    trigger = _deferred_trigger(op)
    assert trigger.api_error_budget_s == 1200.0
    fake_gke.get_failure = lambda path: 503 if sim_clock.now < 600 else None  # from the first read

    [event] = _events(trigger)
    assert event["phase"] == "Succeeded", event
    assert sim_clock.now >= 600
    assert fake_gke.failed_gets >= 5
    assert max(sim_clock.sleeps) == 120.0  # the backoff is capped
    assert op.execute_complete({"ti": FakeTI()}, event)["phase"] == "Succeeded"
    assert fake_gke.deleted == []


def test_a_lost_watch_fails_retryably_and_the_retry_adopts_the_jobset(
    fake_gke, recorded_status, sim_clock
) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    jobset = _jobset()
    fake_gke.statuses = [
        recorded_status("status_running.json")["status"],
        recorded_status("status_succeeded.json")["status"],
    ]
    op = _run_op(jobset)
    trigger = _deferred_trigger(op)
    outage = {"on": True}
    fake_gke.get_failure = lambda path: 503 if outage["on"] else None

    [event] = _events(trigger)  # first try: the API stays down past the budget
    assert event["phase"] == "error" and "budget 1200s" in event["message"]
    assert sim_clock.now == 1200.0
    with pytest.raises(AirflowException, match="could not follow its status") as excinfo:
        op.execute_complete({"ti": FakeTI()}, event)
    assert not isinstance(excinfo.value, AirflowFailException)  # Airflow retries it

    outage["on"] = False  # the retry: the same operator runs again
    ti = FakeTI()
    [event] = _events(_deferred_trigger(op, ti))
    assert op.execute_complete({"ti": ti}, event)["phase"] == "Succeeded"
    assert list(fake_gke.objects) == [("default", jobset["metadata"]["name"])]  # no duplicate
    assert fake_gke.methods().count("POST") == 2  # the second create got 409 and adopted
    assert fake_gke.deleted == []


def test_a_failed_jobset_fails_without_retry_naming_its_pods(fake_gke, recorded_status) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    fake_gke.statuses = [recorded_status("status_failed_jobs.json")["status"]]
    fake_gke.pods = recorded_status("pods_failed.json")
    op = _run_op(_jobset(), SETTINGS)
    [event] = _events(_deferred_trigger(op))
    assert (event["phase"], event["reason"]) == ("Failed", "FailedJobs")
    assert any("exit code 2 (Error)" in line for line in event["pods"]), event["pods"]
    pod_reads = [path for m, path, _ in fake_gke.requests if "/pods?" in path]
    name = op.jobset["metadata"]["name"]
    assert [unquote(p.split("labelSelector=")[1]) for p in pod_reads] == [
        f"jobset.sigs.k8s.io/jobset-name={name}"
    ]
    with pytest.raises(AirflowFailException) as excinfo:
        op.execute_complete({"ti": FakeTI()}, event)
    message = str(excinfo.value)
    assert "failed pod mlperf-grpo-run-train-61da75ec61-slice-0-0-a1b2c: container job " in message
    assert "exit code 137 (OOMKilled)" in message and "disrupted (TerminationByKubelet)" in message


def test_suspended_time_is_bounded_apart_from_running_time(monkeypatch, recorded_status, sim_clock):
    suspended = recorded_status("status_suspended.json")
    running = recorded_status("status_running.json")
    _scripted(monkeypatch, [suspended] * 5 + [running])  # 5 reads (150 s) waiting for Kueue
    [event] = _events(_trigger(poll_interval_s=30.0, max_suspended_s=600.0, max_running_s=100.0))
    assert (event["phase"], event["reason"]) == ("Failed", "RunningTooLong")
    assert sim_clock.now >= 150 + 100  # the suspended time did not count as running

    _scripted(monkeypatch, [suspended])
    start = sim_clock.now
    [event] = _events(_trigger(poll_interval_s=30.0, max_suspended_s=600.0))
    assert (event["phase"], event["reason"]) == ("Failed", "SuspendedTooLong")
    assert sim_clock.now - start == 600.0
    assert "not admitted" in event["message"]

    from airflow.sdk.exceptions import AirflowFailException

    from tasks.backends.gke.operators import RunJobSetOperator

    op = RunJobSetOperator(task_id="run", jobset=_jobset(), cluster=SETTINGS.cluster)
    with pytest.raises(AirflowFailException, match=r"\(SuspendedTooLong\): suspended \(not ad"):
        op.execute_complete({}, event)


def test_defer_timeout_is_running_plus_suspended_bound() -> None:
    from datetime import timedelta

    op = _run_op(_jobset())
    op.job_timeout = timedelta(hours=24)
    assert op._defer_timeout() == timedelta(hours=24, minutes=REAL_WATCH.max_suspended_minutes)


def test_training_still_running_after_a_stop_request_is_deleted(fake_gke, tmp_path) -> None:
    """Evaluation during training decided the run and wrote the stop request; a trainer that
    has not ended `stop_grace_s` later has its JobSet deleted, and the run task succeeds with
    what was committed. A request of another run in the folder deletes nothing."""
    from airflow.sdk.exceptions import TaskDeferred
    from synthetic_run import make_run

    from rcpflow.stop_request import request_stop
    from tasks.backends.gke.operators import RunJobSetOperator

    run = make_run(str(tmp_path / "run"), last_step=20, accuracies={18: 0.3, 19: 0.8})
    jobset = _jobset()
    op = RunJobSetOperator(
        task_id="run", jobset=jobset, stop_run_dir=run.run_dir, stop_grace=timedelta(0),
        cluster=SETTINGS.cluster,
    )  # fmt: skip
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": FakeTI()})
    name = jobset["metadata"]["name"]
    assert request_stop(run.run_dir) is not None

    [event] = _events(deferred.value.trigger)  # the JobSet has no status: still running
    assert (event["phase"], event["reason"]) == ("Stopped", "StopRequest")
    assert fake_gke.deleted == [name] and fake_gke.objects == {}
    assert op.execute_complete({}, event)["phase"] == "Stopped"


def test_a_stop_request_of_another_run_deletes_nothing(
    fake_gke, monkeypatch, recorded_status, tmp_path
) -> None:
    from synthetic_run import T0, make_run

    from rcpflow.stop_request import RunIdentity, StopRequest

    run = make_run(str(tmp_path / "run"), last_step=20)
    other = StopRequest(RunIdentity(1, 256, 18, 24, T0 - 1), 19, run.row(19).timestamp_ms, "old")
    (tmp_path / "run" / "stop_request.json").write_bytes(other.to_json())
    _scripted(monkeypatch, [recorded_status("status_running.json")] * 3
              + [recorded_status("status_succeeded.json")])  # fmt: skip
    [event] = _events(_trigger(stop_run_dir=run.run_dir, stop_grace_s=0))
    assert event["phase"] == "Succeeded"
