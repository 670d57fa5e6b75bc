"""The GKE driver (`tasks.backends.gke.driver.GkeDriver`) under the one lifecycle: the watch
(`WatchTrigger` reading through the driver: its status handling, its clocks in the trigger's
memo, its classpath), the run operator (`RunJobOperator`) and the teardown
(`CancelRecordedJobs`) driving the Google provider's real GKE hooks against a stand-in
Kubernetes API (`fake_gke`: only the cluster lookup and the Google credentials are replaced)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fake_task import FakeTI
from jobset_watch import (
    DAG_ID,
    JOBSETS,
    REF,
    RUN_ID,
    SETTINGS,
    _ctx,
    _deferred_trigger,
    _events,
    _finish,
    _follow,
    _jobset,
    _op,
    _resolve,
    _restarted,
    _scripted,
    _state,
    _trigger,
)

from tasks.backend_api.job_state import JobState
from tasks.backend_api.lifecycle_names import ENDED
from tasks.backends.gke.driver import GkeDriver
from tasks.backends.gke.settings import GkeSettings

# --- the watch: status handling with a scripted status source ----------------------------


def test_trigger_waits_through_running_and_suspended(
    monkeypatch, recorded_status, sim_clock
) -> None:
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
    events = _follow(_trigger())
    assert len(reads) == 5
    # running -> suspended -> running: each change deferred again with the state
    assert [e["phase"] for e in events] == ["watching", "watching", "ended"]
    assert [e["reason"] for e in events[:2]] == ["StateChanged"] * 2
    assert events[0]["kwargs"]["memo"]["suspended_since"] is not None
    assert events[1]["kwargs"]["memo"]["suspended_since"] is None
    state = _state(events[-1])
    assert state.outcome == "succeeded" and "16 succeeded" in state.line


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
    state = _state(event)
    assert (state.outcome, state.reason) == ("fail_now", reason)
    assert "first failed job" in state.line


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
    [event] = _events(_trigger(poll_interval_s=30.0, outage_budget_s=1200.0))
    assert _state(event).outcome == "succeeded" and len(reads) == 5
    # backoff doubles from the poll interval and starts afresh after a good read
    assert sim_clock.sleeps == [30.0, 60.0, 30.0, 30.0]


def test_an_outage_longer_than_the_budget_defers_again_and_never_fails(
    monkeypatch, sim_clock
) -> None:
    reads = _scripted(monkeypatch, [PermissionError("403 Forbidden")])
    trigger = _trigger(poll_interval_s=10.0, outage_budget_s=300.0)
    [event] = _events(trigger)
    assert (event["phase"], event["reason"]) == ("watching", "Unreachable")
    assert sim_clock.now == 300.0  # at the budget, not before and not a backoff later
    assert sim_clock.sleeps == [10.0, 20.0, 40.0, 80.0, 120.0, 30.0]  # capped at 120 s
    assert len(reads) == 7
    assert "failed every read for 300s" in event["message"] and "403 Forbidden" in event["message"]
    assert event["kwargs"]["outage_since"] == 0.0  # kept: the next trigger knows since when
    [again] = _events(_restarted(_resolve(trigger.serialize()[0])(**event["kwargs"])))
    assert again["phase"] == "watching" and "for 600s" in again["message"]


def test_trigger_deleted_jobset_and_malformed_status(monkeypatch, recorded_status) -> None:
    from tasks.backends.gke.status import JobSetGone

    _scripted(monkeypatch, [JobSetGone("JobSet default/js not found")])
    [event] = _events(_trigger())
    state = _state(event)
    assert (state.outcome, state.reason) == ("fail_now", "NotFound")
    assert "not found" in state.line

    _scripted(monkeypatch, [recorded_status("status_contradictory.json")])
    [event] = _events(_trigger())
    state = _state(event)
    assert state.outcome == "lost" and "contradictory" in state.line


def test_a_jobset_created_again_under_the_name_is_a_named_error(
    monkeypatch, recorded_status
) -> None:
    from tasks.backend_api.job_operator import JobReplacedError

    running = recorded_status("status_running.json")
    other = {**running, "metadata": {**running["metadata"], "uid": "uid-2"}}
    _scripted(monkeypatch, [other])
    [event] = _events(_trigger(uid="uid-1"))
    state = _state(event)
    assert (state.outcome, state.reason) == ("foreign", "Replaced")
    assert "'uid-2'" in state.line and "'uid-1'" in state.line

    ti = FakeTI()
    with pytest.raises(JobReplacedError, match="deleted and created again"):
        _op().execute_complete(_ctx(ti), event)
    assert ti.pushed["cluster_job"]["cancel"] is False  # not ours: the teardown leaves it


def test_trigger_serializes_to_an_importable_classpath() -> None:
    trigger = _trigger(uid="u", suspended_since=5.0)
    classpath, kwargs = trigger.serialize()
    assert classpath == "tasks.backend_api.watch_trigger.WatchTrigger"
    json.dumps(kwargs)  # what the triggerer stores must be JSON
    again = _resolve(classpath)(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert kwargs["driver"] == "gke" and kwargs["ref"] == REF
    assert kwargs["memo"] == {"running_since": 0.0, "uid": "u", "suspended_since": 5.0}
    # the cluster by name, never its endpoint: that is looked up when the trigger runs
    args = kwargs["driver_args"]
    assert set(args) == {"cluster", "namespace"}
    assert set(args["cluster"]) == {
        "location", "cluster_name", "project_id", "gcp_conn_id", "impersonation_chain",
        "use_internal_ip", "use_dns_endpoint", "kubernetes_conn_id",
    }  # fmt: skip
    assert not {"cluster_url", "ssl_ca_cert"} & {*kwargs, *args, *args["cluster"]}


def test_the_driver_is_rebuilt_from_its_args_on_the_triggerer() -> None:
    from tasks.backend_api.watch_trigger import load_driver

    settings = GkeSettings(
        namespace="ml", project_id="p", location="europe-west4", cluster_name="c",
        impersonation_chain=("a@p.iam.gserviceaccount.com",), use_internal_ip=True,
    )  # fmt: skip
    driver = GkeDriver(settings)
    args = json.loads(json.dumps(driver.args()))
    again = load_driver("gke", args)
    assert isinstance(again, GkeDriver)
    assert again.cluster == settings.cluster and again.settings.namespace == "ml"
    assert again.args() == driver.args()
    assert again.describe({"name": "js", "namespace": "ml"}) == "JobSet ml/js"
    # restarts are the JobSet's failurePolicy, on the cluster: the lifecycle submits none
    assert driver.max_restarts("train") == driver.max_restarts("evaluate") == 0
    with pytest.raises(NotImplementedError, match="failurePolicy"):
        driver.restart(None, None)  # type: ignore[arg-type]
    assert driver.output_tail(REF, JobState("failed", "fail_now")) == ""
    assert (driver.poll_interval_s, driver.run_retries) == (30.0, 2)


# --- the run operator's outcome, without a cluster -----------------------------------------


def _ended(state: JobState) -> dict[str, Any]:
    """The event the watch of JobSet default/js ends with in `state`."""
    return dict(_trigger().event(ENDED, state=state))


def test_execute_complete_maps_job_states_to_task_outcomes() -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    op = _op()
    ti = FakeTI()
    done = op.execute_complete(_ctx(ti), _ended(JobState("succeeded [p]", "succeeded")))
    assert done == {
        "name": "js", "namespace": "default", "outcome": "succeeded", "exit_code": None,
        "restarts": {"counted": 0, "uncounted": 0},
    }  # fmt: skip
    assert ti.pushed["cluster_job"]["cancel"] is True

    failed = JobState("failed (ReachedMaxRestarts): m [p]", "fail_now", reason="ReachedMaxRestarts")
    with pytest.raises(
        AirflowFailException, match=r"JobSet default/js: failed \(ReachedMaxRestarts\): m"
    ):
        op.execute_complete(_ctx(ti), _ended(failed))
    assert ti.pushed["cluster_job"]["cancel"] is True

    lost = JobState("unreadable status: bad status", "lost")
    with pytest.raises(AirflowException, match="the job is left as it is") as excinfo:
        op.execute_complete(_ctx(ti), _ended(lost))
    assert not isinstance(excinfo.value, AirflowFailException)  # retryable
    assert ti.pushed["cluster_job"] == {
        "name": "js", "namespace": "default", "cancel": False,
        "why": "watch error: unreadable status: bad status",
    }  # fmt: skip


def _container_env(jobset: dict[str, Any]) -> list[dict[str, Any]]:
    jobs = jobset["spec"]["replicatedJobs"]
    pods = [job["template"]["spec"]["template"]["spec"] for job in jobs]
    return [entry for pod in pods for c in pod["containers"] for entry in c.get("env", [])]


def _rendered(op: Any, ctx: dict[str, Any]) -> dict[str, Any]:
    """The JobSet the operator's driver would create in this task (`GkeDriver.render`)."""
    rendered: dict[str, Any] = op.driver.render(op.request(ctx))
    return rendered


def test_the_training_pods_carry_the_dag_runs_owner_identity_and_evaluations_do_not() -> None:
    from rcpflow.trainer.ownership import OWNER_ENV, airflow_owner

    train = _rendered(_op(role="train", label="train"), _ctx())
    owner = [e for e in _container_env(train) if e["name"] == OWNER_ENV]
    assert owner and all(e["value"] == airflow_owner(DAG_ID, RUN_ID, "g.run") for e in owner)
    evaluate = _rendered(_op(), _ctx())
    assert [e for e in _container_env(evaluate) if e["name"] == OWNER_ENV] == []


def test_a_bad_command_is_refused_before_anything_is_recorded() -> None:
    from airflow.sdk.exceptions import AirflowException

    ti = FakeTI()
    op = _op(argv=["python", "bad\x00arg"])
    with pytest.raises(
        AirflowException, match=r"eval-18: render_jobset: command\[1\] contains a NUL"
    ):
        op.execute(_ctx(ti))
    assert ti.pushed == {}


def test_cleanup_without_a_recorded_jobset_does_nothing(fake_gke) -> None:
    from tasks.backend_api.teardown import CancelRecordedJobs

    op = CancelRecordedJobs(driver=GkeDriver(SETTINGS), run_task_id="g.run")
    assert op.task_id == "cleanup"
    ti = FakeTI(map_index=3)
    assert op.execute({"ti": ti}) == []
    assert ti.pulls == [("g.run", "cluster_job", 3)]
    assert fake_gke.requests == []


# --- the lifecycle through the provider's GKE hooks -----------------------------------------

CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/jobsets.jobset.x-k8s.io"


def test_run_checks_the_crd_creates_strictly_defers_and_follows(fake_gke, recorded_status) -> None:
    jobset = _jobset()
    name = jobset["metadata"]["name"]
    fake_gke.statuses = [
        recorded_status("status_running.json")["status"],
        recorded_status("status_succeeded.json")["status"],
    ]
    op = _op()
    ti = FakeTI()
    trigger = _deferred_trigger(op, ti)

    uid = fake_gke.objects[("default", name)]["metadata"]["uid"]
    # the reference names the object created (its UID), not only the name
    assert ti.pushed == {
        "cluster_job": {
            "name": name, "namespace": "default", "uid": uid, "cancel": None, "why": "running"
        }
    }  # fmt: skip
    # the CRD is read before the create, and the create is strict
    assert [(m, path.split("?")[0]) for m, path, _ in fake_gke.requests[:2]] == [
        ("GET", CRD), ("POST", JOBSETS),
    ]  # fmt: skip
    assert fake_gke.requests[1][2] == "Bearer test-token"
    assert fake_gke.field_validation == ["Strict"] and fake_gke.pruned == []
    stored = json.loads(json.dumps(fake_gke.objects[("default", name)]))
    assert stored["metadata"].pop("uid") == uid
    assert stored == jobset  # the rendered object, unchanged
    ref = {**REF, "name": name, "uid": uid}
    assert (trigger.driver, trigger.ref, trigger.memo["uid"]) == ("gke", ref, uid)
    # the watch's bounds: the deployment's suspended bound, no running bound without a timeout
    assert trigger.memo["max_suspended_s"] == SETTINGS.max_suspended_minutes * 60.0
    assert trigger.memo["max_running_s"] is None
    assert trigger.poll_interval_s == SETTINGS.poll_interval_s and trigger.settle_s == 0.0

    gets_before = fake_gke.methods().count("GET")
    result, events = _finish(op, _ctx(ti), trigger)  # kubernetes_asyncio, GKEKubernetesAsyncHook
    assert fake_gke.methods().count("GET") > gets_before
    assert result["outcome"] == "succeeded" and [e["phase"] for e in events] == ["ended"]
    assert result["name"] == name and result["exit_code"] == 0


def test_an_older_jobset_crd_is_refused_before_anything_is_created(
    fake_gke, older_crd_document
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    fake_gke.crd = older_crd_document
    ti = FakeTI()
    with pytest.raises(AirflowFailException) as excinfo:
        _op().execute(_ctx(ti))
    message = str(excinfo.value)
    assert "spec.failurePolicy.rules[0].onJobFailureMessagePatterns (JobSet v0.10)" in message
    assert "older than JobSet v0.10" in message and "Install JobSet v0.10 or newer" in message
    assert fake_gke.objects == {} and "POST" not in fake_gke.methods()
    assert ti.pushed["cluster_job"]["cancel"] is False  # recorded first, left alone

    fake_gke.crd = None  # JobSet not installed at all
    with pytest.raises(AirflowFailException, match=r"jobsets\.jobset\.x-k8s\.io is not installed"):
        _op().execute(_ctx())


def test_a_create_the_cluster_would_prune_is_an_error_not_a_silent_change(
    fake_gke, older_crd_document
) -> None:
    from kubernetes.client.exceptions import ApiException

    from tasks.backends.gke.hooks import JobSetHook

    fake_gke.crd = older_crd_document
    hook = JobSetHook.for_cluster(SETTINGS.cluster)
    with pytest.raises(ApiException) as excinfo:
        hook.create_jobset(_jobset())
    assert excinfo.value.status == 400
    message = json.loads(excinfo.value.body)["message"]
    assert 'unknown field "spec.failurePolicy.rules[0].onJobFailureMessagePatterns"' in message
    assert fake_gke.objects == {} and fake_gke.field_validation == ["Strict"]


def test_run_retry_adopts_its_own_jobset_and_refuses_a_foreign_one(fake_gke) -> None:
    from airflow.sdk.exceptions import AirflowException

    from tasks.backends.gke.render import JobSetConflictError

    jobset = _jobset()
    op = _op()
    uids = [_deferred_trigger(op).memo["uid"] for _ in range(2)]  # the second finds the first's
    assert len(fake_gke.objects) == 1 and uids[0] == uids[1] is not None
    assert fake_gke.methods().count("POST") == 2

    other = _op(GkeSettings(use_dns_endpoint=True, image="rcpflow-tpu:other"))
    assert _rendered(other, _ctx())["metadata"]["name"] == jobset["metadata"]["name"]
    ti = FakeTI()
    with pytest.raises(AirflowException, match="not rendered from this spec") as excinfo:
        other.execute(_ctx(ti))
    assert isinstance(excinfo.value.__cause__, JobSetConflictError)
    assert ti.pushed["cluster_job"]["cancel"] is False  # a foreign JobSet: never deleted
    assert fake_gke.deleted == [] and len(fake_gke.objects) == 1


def test_run_never_defers_on_a_jobset_the_cluster_does_not_have(fake_gke) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    jobset = _jobset()
    fake_gke.fail_posts = [503]  # the create fails and the apiserver did not apply it
    op = _op()
    with pytest.raises(AirflowException, match=r"not on the cluster after the create call fa") as e:
        op.execute(_ctx())
    assert not isinstance(e.value, AirflowFailException)  # a retry creates it
    assert fake_gke.objects == {}
    assert fake_gke.methods() == ["GET", "POST", "GET"]  # CRD, one create, the read that tells
    _deferred_trigger(op)  # what Airflow's retry does: now it is created
    assert ("default", jobset["metadata"]["name"]) in fake_gke.objects


def test_trigger_on_a_deleted_jobset_fails_it(fake_gke) -> None:
    [event] = _events(_trigger(ref={**REF, "name": "gone"}, poll_interval_s=0.01))  # GET -> 404
    state = _state(event)
    assert (state.outcome, state.reason) == ("fail_now", "NotFound")


def _cleanup(ti: FakeTI) -> Any:
    from tasks.backend_api.teardown import CancelRecordedJobs

    op = CancelRecordedJobs(driver=GkeDriver(SETTINGS), run_task_id="g.run")
    ti.xcoms[("g.run", "cluster_job", ti.map_index)] = ti.pushed["cluster_job"]
    return op.execute({"ti": ti})


def test_cleanup_deletes_after_an_outcome_or_a_users_mark(fake_gke, recorded_status) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    ti = FakeTI(map_index=2)
    trigger = _deferred_trigger(_op(), ti)
    name = trigger.ref["name"]
    where = f"JobSet default/{name}"
    # deferred, then marked failed by hand: the task never decided; the teardown deletes
    assert ti.pushed["cluster_job"]["cancel"] is None
    assert _cleanup(ti) == [{"job": where, "cancelled": True}]
    assert fake_gke.objects == {} and fake_gke.deleted == [name]
    deletes = [(path, auth) for m, path, auth in fake_gke.requests if m == "DELETE"]
    assert deletes == [(f"{JOBSETS}/{name}", "Bearer test-token")]
    # only the object the task created: the delete's UID precondition
    assert fake_gke.delete_preconditions == [trigger.ref["uid"]]
    assert _cleanup(ti) == [{"job": where, "cancelled": False}]  # already gone: fine
    assert fake_gke.methods().count("DELETE") == 1  # read first: nothing to delete

    fake_gke.statuses = [recorded_status("status_failed_jobs.json")["status"]]
    op = _op()
    trigger = _deferred_trigger(op, ti)
    with pytest.raises(AirflowFailException):
        _finish(op, _ctx(ti), trigger)
    assert ti.pushed["cluster_job"]["cancel"] is True  # a real failure
    # it had ended: not cancelled, but removed (its pods and Service with it)
    assert _cleanup(ti) == [{"job": where, "cancelled": False}]
    assert fake_gke.objects == {} and fake_gke.deleted == [name, name]
    assert fake_gke.delete_preconditions[-1] == trigger.ref["uid"]


def test_cleanup_leaves_a_jobset_whose_watch_failed(fake_gke, recorded_status) -> None:
    from airflow.sdk.exceptions import AirflowException

    # the create's read-back sees no status yet, the watch a contradictory one
    fake_gke.statuses = [None, recorded_status("status_contradictory.json")["status"]]
    ti = FakeTI()
    op = _op()
    trigger = _deferred_trigger(op, ti)
    with pytest.raises(AirflowException, match="the job is left as it is"):
        _finish(op, _ctx(ti), trigger)
    name = trigger.ref["name"]
    assert _cleanup(ti) == [{"job": f"JobSet default/{name}", "cancelled": False}]
    assert fake_gke.deleted == [] and len(fake_gke.objects) == 1


def test_on_kill_deletes_the_jobset_the_task_owns(fake_gke) -> None:
    op = _op()
    op.on_kill()  # nothing created yet: nothing to delete
    assert "DELETE" not in fake_gke.methods()
    trigger = _deferred_trigger(op)
    op.on_kill()
    assert fake_gke.deleted == [trigger.ref["name"]] and fake_gke.objects == {}


def test_a_jobset_replaced_under_its_name_is_never_deleted(fake_gke) -> None:
    """Someone deleted the task's JobSet and created another under its name: the reference's
    UID names the task's object, so neither its cancel, nor on_kill, nor the teardown deletes
    the other one (the delete carries the UID as the API's precondition, so a replacement
    between the read and the delete is refused by the apiserver too)."""
    from tasks.backend_api.teardown import CancelRecordedJobs

    ti = FakeTI()
    op = _op()
    trigger = _deferred_trigger(op, ti)
    ref, key = trigger.ref, ("default", trigger.ref["name"])
    assert ref["uid"] == fake_gke.objects[key]["metadata"]["uid"]
    fake_gke.objects[key]["metadata"]["uid"] = "someone-elses"  # deleted and created again

    driver = GkeDriver(SETTINGS)
    assert driver.cancel(ref) is False
    op.on_kill()
    teardown = CancelRecordedJobs(driver=driver, run_task_id="g.run")
    ti.xcoms[("g.run", "cluster_job", -1)] = ti.pushed["cluster_job"]  # undecided: cancel
    assert teardown.execute({"ti": ti}) == [{"job": driver.describe(ref), "cancelled": False}]
    assert "DELETE" not in fake_gke.methods() and key in fake_gke.objects

    # the apiserver's own check, for a replacement between the read and the delete
    from tasks.backends.gke.hooks import JobSetHook

    hook = JobSetHook.for_cluster(SETTINGS.cluster)
    assert hook.delete_jobset("default", ref["name"], ref["uid"]) is False
    assert key in fake_gke.objects and fake_gke.delete_preconditions == [ref["uid"]]

    async def from_the_triggerer() -> bool:
        from tasks.backends.gke.hooks import AsyncJobSetHook

        ahook = await AsyncJobSetHook.for_cluster(SETTINGS.cluster)
        return await ahook.delete_jobset("default", ref["name"], ref["uid"])

    assert asyncio.run(from_the_triggerer()) is False and key in fake_gke.objects
    assert hook.delete_jobset("default", ref["name"], "someone-elses") is True
    assert fake_gke.objects == {}


def test_a_finished_jobset_is_not_cancelled_but_removed_by_the_teardown(
    fake_gke, recorded_status
) -> None:
    """`cancel` of a JobSet that has finished answers False (the protocol's "it had ended")
    and deletes nothing; `remove` (after the teardown) deletes it, only the object of the
    reference's UID, and leaves a running one and one known by name alone."""
    driver = GkeDriver(SETTINGS)
    trigger = _deferred_trigger(_op())
    ref, key = trigger.ref, ("default", trigger.ref["name"])
    driver.remove(ref)  # running: left
    driver.remove({k: v for k, v in ref.items() if k != "uid"})  # not known to be ours
    assert "DELETE" not in fake_gke.methods()
    fake_gke.statuses = [recorded_status("status_succeeded.json")["status"]]
    assert driver.cancel(ref) is False and key in fake_gke.objects
    assert driver.cancel_step(DAG_ID, RUN_ID, "", 18) is False and key in fake_gke.objects
    driver.remove({**ref, "uid": "another"})
    assert "DELETE" not in fake_gke.methods()
    driver.remove(ref)
    assert fake_gke.objects == {} and fake_gke.delete_preconditions == [ref["uid"]]
    driver.remove(ref)  # gone: nothing
    assert fake_gke.methods().count("DELETE") == 1
