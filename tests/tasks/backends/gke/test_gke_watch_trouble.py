"""The GKE driver's watch under API trouble and with pod detail: a 60-minute outage, a
triggerer restart, failed JobSets and their pods, the suspended and running bounds, the
deferral timeout, and a stop request's grace (the stand-in API of `fake_gke`)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from urllib.parse import unquote

import pytest
from fake_task import FakeTI
from jobset_watch import (
    _ctx,
    _deferred_trigger,
    _events,
    _finish,
    _follow,
    _op,
    _resolve,
    _restarted,
    _scripted,
    _ScriptedHook,
    _state,
    _trigger,
)

from tasks.backend_api.lifecycle_names import STOPPED, WATCHING
from tasks.backends.gke.driver import GkeDriver
from tasks.backends.gke.settings import GkeSettings

# --- the watch under API trouble, with pod detail ------------------------------------------

REAL_WATCH = GkeSettings(use_dns_endpoint=True)  # the default watch: 30 s polls, 20 min budget


def test_a_60_minute_api_outage_during_training_leaves_it_running_and_the_task_resumes(
    fake_gke, recorded_status, sim_clock
) -> None:
    """Training is running; from the watch's first read the API answers 503 for 40 simulated
    minutes and then refuses connections for 20 more (a new endpoint lookup each time), three
    times the error budget. The watch defers again at each budget (as a restarted triggerer
    would resume it: from the kwargs), the JobSet is never touched, and when the API answers
    the task goes on to the training's success with its running clock intact."""
    running = recorded_status("status_running.json")["status"]
    succeeded = recorded_status("status_succeeded.json")["status"]
    op = _op(REAL_WATCH, role="train", label="train", job_timeout=timedelta(hours=24))
    ti = FakeTI()
    trigger = _deferred_trigger(op, ti)
    name = trigger.ref["name"]
    created = json.loads(json.dumps(fake_gke.objects[("default", name)]))
    assert trigger.memo["running_since"] == 0.0  # the operator's read-back: running since submit
    assert trigger.memo["max_running_s"] == 24 * 3600.0

    def answer(path: str) -> int | None:
        if "/jobsets/" in path and sim_clock.now < 40 * 60:
            return 503
        return None

    fake_gke.get_failure = answer
    refused_lookups: list[float] = []

    def endpoint() -> str:
        if 40 * 60 <= sim_clock.now < 60 * 60:
            refused_lookups.append(sim_clock.now)
            return fake_gke.dead_url
        return fake_gke.url

    fake_gke.endpoint = endpoint  # type: ignore[method-assign]
    fake_gke.scripts = {name: [running, running, succeeded]}

    result, events = _finish(op, _ctx(ti), trigger)
    assert result["outcome"] == "succeeded", events
    assert [e["reason"] for e in events[:-1]] == ["Unreachable"] * 2  # at 20 and 40 min
    assert sim_clock.now >= 60 * 60 and fake_gke.failed_gets >= 10 and refused_lookups
    assert max(sim_clock.sleeps) == 120.0  # the backoff is capped
    # the JobSet was never deleted or changed, and the outage counted as running time
    assert fake_gke.deleted == [] and "DELETE" not in fake_gke.methods()
    assert fake_gke.objects[("default", name)] == created
    assert events[-2]["kwargs"]["memo"]["running_since"] == 0.0
    assert ti.pushed["cluster_job"]["cancel"] is True  # succeeded: the teardown may clean up


def test_a_triggerer_restart_keeps_every_clock(monkeypatch, recorded_status, sim_clock) -> None:
    suspended = recorded_status("status_suspended.json")
    running = recorded_status("status_running.json")
    _scripted(monkeypatch, [suspended] * 4 + [running] * 100)
    trigger = _trigger(
        poll_interval_s=30.0, running_since=None, suspended_since=0.0, max_running_s=300.0,
        max_suspended_s=3600.0,
    )  # fmt: skip
    [admitted] = _events(trigger)  # suspended 4 reads, then running: a change, persisted
    assert admitted["phase"] == "watching"
    state = admitted["kwargs"]
    assert (state["memo"]["suspended_since"], state["memo"]["running_since"]) == (None, 120.0)
    sim_clock.now += 100.0  # the triggerer was down 100 s: the JobSet ran meanwhile
    [event] = _events(_restarted(_resolve(trigger.serialize()[0])(**state)))
    assert (_state(event).outcome, _state(event).reason) == ("fail_now", "RunningTooLong")
    # at the first poll after 300 s of running since admission at 120 s, the restart's 100 s
    # included (a trigger whose clock started afresh would go on until 520 s)
    assert sim_clock.now == 430.0


def test_a_failed_jobset_fails_without_retry_naming_its_pods(fake_gke, recorded_status) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    fake_gke.statuses = [recorded_status("status_failed_jobs.json")["status"]]
    fake_gke.pods = recorded_status("pods_failed.json")
    op = _op()
    [event] = _events(_deferred_trigger(op))
    state = _state(event)
    assert (state.outcome, state.reason) == ("fail_now", "FailedJobs")
    assert any("exit code 2 (Error)" in line for line in state.detail), state.detail
    assert all(line.startswith("failed pod ") for line in state.detail), state.detail
    pod_reads = [path for m, path, _ in fake_gke.requests if "/pods?" in path]
    name = event["ref"]["name"]
    assert [unquote(p.split("labelSelector=")[1]) for p in pod_reads] == [
        f"jobset.sigs.k8s.io/jobset-name={name}"
    ]
    with pytest.raises(AirflowFailException) as excinfo:
        op.execute_complete(_ctx(), event)
    message = str(excinfo.value)
    assert "failed pod mlperf-grpo-run-train-61da75ec61-slice-0-0-a1b2c: container job " in message
    assert "exit code 137 (OOMKilled)" in message and "disrupted (TerminationByKubelet)" in message
    assert f"JobSet default/{name}: failed (FailedJobs)" in message


def test_a_failed_jobset_whose_pods_cannot_be_read_still_fails_naming_why(
    monkeypatch, recorded_status
) -> None:
    _scripted(monkeypatch, [recorded_status("status_failed_jobs.json")])

    async def no_pods(self: Any, namespace: str, name: str) -> dict[str, Any]:
        raise PermissionError("403 list pods")

    monkeypatch.setattr(_ScriptedHook, "list_jobset_pods", no_pods)
    [event] = _events(_trigger())
    state = _state(event)
    assert (state.outcome, state.reason) == ("fail_now", "FailedJobs")
    assert state.detail == ("(could not read the JobSet's pods: PermissionError('403 list pods'))",)


def test_suspended_time_is_bounded_apart_from_running_time(monkeypatch, recorded_status, sim_clock):
    suspended = recorded_status("status_suspended.json")
    running = recorded_status("status_running.json")
    _scripted(monkeypatch, [suspended] * 5 + [running])  # 5 reads (150 s) waiting for Kueue
    trigger = _trigger(
        poll_interval_s=30.0, max_suspended_s=600.0, max_running_s=100.0, running_since=None,
        suspended_since=0.0,
    )  # fmt: skip
    events = _follow(trigger)
    assert (_state(events[-1]).outcome, _state(events[-1]).reason) == (
        "fail_now", "RunningTooLong",
    )  # fmt: skip
    assert sim_clock.now >= 150 + 100  # the suspended time did not count as running

    _scripted(monkeypatch, [suspended])
    start = sim_clock.now
    [event] = _events(
        _trigger(poll_interval_s=30.0, max_suspended_s=600.0, running_since=None,
                 suspended_since=start)
    )  # fmt: skip
    state = _state(event)
    assert (state.outcome, state.reason) == ("fail_now", "SuspendedTooLong")
    assert sim_clock.now - start == 600.0
    assert "not admitted" in state.line

    from airflow.sdk.exceptions import AirflowFailException

    ti = FakeTI()
    with pytest.raises(AirflowFailException, match=r"SuspendedTooLong: suspended \(not ad"):
        _op().execute_complete(_ctx(ti), event)
    assert ti.pushed["cluster_job"]["cancel"] is True  # a bound the deployment set


def test_defer_timeout_is_an_outer_net_behind_the_bounds(sim_clock) -> None:
    driver = GkeDriver(REAL_WATCH)
    memo = {"submitted_at": 0.0}
    bounds = timedelta(hours=24, minutes=REAL_WATCH.max_suspended_minutes)
    assert driver.defer_timeout(timedelta(hours=24), memo) == bounds + timedelta(minutes=10)
    sim_clock.now = 3600.0  # a re-defer an hour later: the net does not move
    later = bounds + timedelta(minutes=10) - timedelta(hours=1)
    assert driver.defer_timeout(timedelta(hours=24), memo) == later
    assert driver.defer_timeout(None, memo) is None  # no timeout: no net
    sim_clock.now = 1e9  # long past: the least timeout, never a negative one
    assert driver.defer_timeout(timedelta(hours=24), memo) == timedelta(seconds=1)


def test_the_operator_defers_again_with_the_memo_and_the_net(
    fake_gke, recorded_status, sim_clock
) -> None:
    """A watching event: the operator defers again with the watch's kwargs (its memo kept) and
    Airflow's timeout computed from the memo's submission time, not from the re-defer."""
    from airflow.sdk.exceptions import TaskDeferred

    op = _op(REAL_WATCH, job_timeout=timedelta(hours=1))
    trigger = _deferred_trigger(op)
    sim_clock.now = 600.0
    event = trigger.event(WATCHING, reason="StateChanged")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete(_ctx(), event)
    again = deferred.value
    assert again.trigger.memo == trigger.memo and again.method_name == "execute_complete"
    net = timedelta(hours=1, minutes=REAL_WATCH.max_suspended_minutes + 10) - timedelta(minutes=10)
    assert again.timeout == net


def test_training_still_running_after_a_stop_request_is_deleted(fake_gke, tmp_path) -> None:
    """Evaluation during training decided the run and wrote the stop request; a trainer that
    has not ended `stop_grace_s` later has its JobSet deleted, and the run task succeeds with
    what was committed. A request of another run in the folder deletes nothing."""
    from devtools.synthetic_run import make_run
    from rcpflow.verdict.stop_request import request_stop

    run = make_run(str(tmp_path / "run"), last_step=20, accuracies={18: 0.3, 19: 0.8})
    op = _op(stop_run_dir=run.run_dir, stop_grace=timedelta(0))
    ti = FakeTI()
    trigger = _deferred_trigger(op, ti)
    name = trigger.ref["name"]
    assert request_stop(run.run_dir) is not None

    result, events = _finish(op, _ctx(ti), trigger)  # the JobSet has no status: still running
    assert (events[-1]["phase"], events[-1]["reason"]) == (STOPPED, "StopRequest")
    assert fake_gke.deleted == [name] and fake_gke.objects == {}
    assert result["outcome"] == "stopped" and result["name"] == name
    assert ti.pushed["cluster_job"]["cancel"] is True


def test_a_stop_request_of_another_run_deletes_nothing(
    fake_gke, monkeypatch, recorded_status, tmp_path
) -> None:
    from devtools.synthetic_run import T0, make_run
    from rcpflow.verdict.stop_request import RunIdentity, StopRequest

    run = make_run(str(tmp_path / "run"), last_step=20)
    other = StopRequest(RunIdentity(1, 256, 18, 24, T0 - 1), 19, run.row(19).timestamp_ms, "old")
    (tmp_path / "run" / "stop_request.json").write_bytes(other.to_json())
    _scripted(monkeypatch, [recorded_status("status_running.json")] * 3
              + [recorded_status("status_succeeded.json")])  # fmt: skip
    [event] = _events(_trigger(stop_run_dir=run.run_dir, stop_grace_s=0))
    assert _state(event).outcome == "succeeded"
    assert fake_gke.deleted == []
