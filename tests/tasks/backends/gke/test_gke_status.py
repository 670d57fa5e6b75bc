"""JobSet status reading against recorded status objects (tests/gke/fixtures/)."""

from __future__ import annotations

import pytest

from tasks.backends.gke.status import JobSetStatusError, failed_pods, interpret_status

FIXTURES = [
    "status_created.json",
    "status_running.json",
    "status_suspended.json",
    "status_restarting.json",
    "status_succeeded.json",
    "status_failed_max_restarts.json",
    "status_failed_jobs.json",
    "status_contradictory.json",
]


@pytest.mark.parametrize("name", FIXTURES)
def test_recorded_objects_have_the_api_shape(name: str, recorded_status, strict_jobset) -> None:
    # The fixtures are hand-written; hold them to the CRD's status schema (spec left out).
    obj = recorded_status(name)
    errors = [e for e in strict_jobset.errors(obj) if "'spec' is a required" not in e]
    assert errors == []


@pytest.mark.parametrize(
    ("name", "phase", "reason", "in_message", "in_progress"),
    [
        ("status_created.json", "Running", "", "", "no status yet"),
        ("status_running.json", "Running", "", "", "slice jobs: 12 ready, 12 active, 4 succeeded"),
        ("status_suspended.json", "Running", "SuspendedJobs", "suspended: ", "1 suspended"),
        ("status_restarting.json", "Running", "", "", "restarts 1"),
        ("status_succeeded.json", "Succeeded", "", "", "16 succeeded"),
        (
            "status_failed_max_restarts.json",
            "Failed",
            "ReachedMaxRestarts",
            "first failed job: mlperf-grpo-run-eval-18-135782acca-slice-3",
            "restarts 2",
        ),
        ("status_failed_jobs.json", "Failed", "FailedJobs", "one or more job failures", "1 failed"),
    ],
)
def test_phase_and_reason(
    name: str, phase: str, reason: str, in_message: str, in_progress: str, recorded_status
) -> None:
    status = interpret_status(recorded_status(name))
    assert status.phase == phase
    assert status.terminal is (phase != "Running")
    assert status.reason == reason
    assert in_message in status.message
    assert in_progress in status.progress
    assert status.describe().startswith(phase)


def test_terminal_state_alone_decides(recorded_status) -> None:
    obj = recorded_status("status_failed_jobs.json")
    del obj["status"]["conditions"]
    status = interpret_status(obj)
    assert (status.phase, status.reason) == ("Failed", "Failed")
    obj["status"]["terminalState"] = "Completed"
    assert interpret_status(obj).phase == "Succeeded"


def test_a_false_failed_condition_is_not_a_failure(recorded_status) -> None:
    obj = recorded_status("status_running.json")
    obj["status"]["conditions"] = [
        {
            "type": "Failed",
            "status": "False",
            "reason": "FailedJobs",
            "message": "",
            "lastTransitionTime": "2026-05-01T12:00:00Z",
        }
    ]
    assert interpret_status(obj).phase == "Running"


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ("contradictory", "contradictory, both Completed and Failed"),
        ({"conditions": {"type": "Failed"}}, "status.conditions: expected a list"),
        ({"conditions": [{"type": "Failed", "status": "yes"}]}, "status.conditions[0]"),
        ({"terminalState": "Done"}, "status.terminalState: unknown value 'Done'"),
        ({"replicatedJobsStatus": [{"name": "slice", "failed": -1}]}, "[0].failed"),
        ({"restarts": "1"}, "status.restarts: expected a count"),
        ([], "status: expected an object"),
    ],
)
def test_malformed_status_is_an_error(status: object, message: str, recorded_status) -> None:
    if status == "contradictory":
        obj = recorded_status("status_contradictory.json")
    else:
        obj = {"metadata": {"name": "x"}, "status": status}
    with pytest.raises(JobSetStatusError) as excinfo:
        interpret_status(obj)
    assert message in str(excinfo.value)


def test_suspended_is_flagged(recorded_status) -> None:
    assert interpret_status(recorded_status("status_suspended.json")).suspended
    assert not interpret_status(recorded_status("status_running.json")).suspended


def test_failed_pods_name_reason_and_exit_code(recorded_status) -> None:
    lines = failed_pods(recorded_status("pods_failed.json"))
    assert lines == [
        "mlperf-grpo-run-train-61da75ec61-slice-0-0-a1b2c: container job exit code 2 (Error)",
        "mlperf-grpo-run-train-61da75ec61-slice-0-3-zz9yx: reason Evicted, disrupted "
        "(TerminationByKubelet), container job exit code 137 (OOMKilled), "
        "The node was low on resource: memory.",
    ]
    assert failed_pods({"items": []}) == []
    many = {"items": [recorded_status("pods_failed.json")["items"][1]] * 7}
    assert failed_pods(many, limit=5)[-1] == "... and 2 more failed pods"
    with pytest.raises(JobSetStatusError, match="items"):
        failed_pods({"kind": "Status"})
