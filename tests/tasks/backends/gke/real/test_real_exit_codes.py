"""docs/exit-codes.md's job contract, row by row, on the real Job and JobSet controllers: the
rendered JobSet's pod ends with each code (kwok ends the running pod as a kubelet would report
it) or is disrupted, and what the real controllers do (complete, fail at once, restart counted
against maxRestarts or not) is what the contract's GKE column says."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from k8s_real import JobSets, condition, fresh_namespace, render, settings, shape
from repo_paths import REPO

from devtools.k8s.binaries import JOBSET_VERSIONS
from devtools.k8s.control_plane import ControlPlane
from tasks.backends.gke.status import failed_pods, interpret_status

RESTART_BUDGET = 2


def _contract() -> dict[str, str]:
    """The job contract's table: code (or "other") -> its GKE column."""
    text = (REPO / "docs" / "exit-codes.md").read_text()
    section = text.split("## The job contract", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+|other) \| .* \| ([a-z ,]+) \|$", section, re.MULTILINE)
    return dict(rows)


CONTRACT = _contract()
# "other" is checked with an OOM kill (137) and an abort (134).
CODES = [*sorted(int(c) for c in CONTRACT if c != "other"), 134, 137]


@pytest.fixture(params=JOBSET_VERSIONS)
def control_plane(request: pytest.FixtureRequest, planes: Any) -> ControlPlane:
    """Each test runs on the oldest (README's minimum) and the newest JobSet built."""
    plane: ControlPlane = planes(request.param)
    return plane


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    with fresh_namespace(control_plane) as name:
        yield name


@pytest.fixture
def jobsets(control_plane: ControlPlane) -> JobSets:
    return JobSets.for_plane(control_plane)


def _single_host(namespace: str, run_id: str) -> dict[str, Any]:
    s = settings(namespace, train=shape("2x2x1", max_restarts=RESTART_BUDGET))
    return render(s, run_id=run_id)


def _restarted(status: dict[str, Any], restarts: int) -> bool:
    return int(status.get("restarts") or 0) >= restarts


def test_the_contract_is_what_this_file_checks() -> None:
    assert set(CONTRACT) == {"0", "1", "2", "3", "4", "5", "143", "other"}
    assert set(CONTRACT.values()) == {
        "success",
        "restart, counted",
        "restart, not counted",
        "fail at once",
    }


@pytest.mark.parametrize("code", CODES)
def test_exit_code_does_what_the_contract_says(
    code: int, jobsets: JobSets, control_plane: ControlPlane, namespace: str
) -> None:
    column = CONTRACT.get(str(code), CONTRACT["other"])
    jobset = _single_host(namespace, f"manual__exit_{code}")
    ns, name = namespace, jobset["metadata"]["name"]
    jobsets.create(jobset)
    (pod,) = jobsets.running_pods(ns, name, 1)
    control_plane.end_pod(ns, pod["metadata"]["name"], code)

    if column == "success":
        done = jobsets.wait_status(
            ns, name, lambda st: condition(st, "Completed") is not None, "Completed"
        )
        assert interpret_status(done).phase == "Succeeded"
        assert int(done["status"].get("restarts") or 0) == 0
    elif column == "fail at once":
        done = jobsets.wait_status(
            ns, name, lambda st: condition(st, "Failed") is not None, "Failed"
        )
        status = interpret_status(done)
        assert status.phase == "Failed"
        assert int(done["status"].get("restarts") or 0) == 0
        # the task's error names the pod and its code (from the real pod status)
        lines = failed_pods(control_plane.api.get(f"/api/v1/namespaces/{ns}/pods"))
        assert len(lines) == 1
        assert f"container job exit code {code} (Error)" in lines[0], lines
        assert pod["metadata"]["name"] in lines[0]
    else:
        counted = column == "restart, counted"
        after = jobsets.wait_status(ns, name, lambda st: _restarted(st, 1), "restarted once")
        status = after["status"]
        assert status["restarts"] == 1
        assert int(status.get("restartsCountTowardsMax") or 0) == (1 if counted else 0)
        assert condition(status, "Failed") is None
        # the restart runs the job again: new pods, restart-attempt 1
        (again,) = jobsets.running_pods(ns, name, 1, attempt=1)
        assert again["metadata"]["uid"] != pod["metadata"]["uid"]
        assert interpret_status(jobsets.get(ns, name)).phase == "Running"


def test_a_disrupted_pod_restarts_without_counting_whatever_its_code(
    jobsets: JobSets, control_plane: ControlPlane, namespace: str
) -> None:
    jobset = _single_host(namespace, "manual__disruption")
    ns, name = namespace, jobset["metadata"]["name"]
    jobsets.create(jobset)
    (pod,) = jobsets.running_pods(ns, name, 1)
    # preempted with exit code 2: a code that alone would fail the JobSet at once
    control_plane.disrupt_pod(ns, pod["metadata"]["name"], exit_code=2)
    after = jobsets.wait_status(ns, name, lambda st: _restarted(st, 1), "restarted once")
    assert int(after["status"].get("restartsCountTowardsMax") or 0) == 0
    assert condition(after["status"], "Failed") is None
    jobsets.running_pods(ns, name, 1, attempt=1)


def test_max_restarts_counts_only_the_counted_restarts(
    jobsets: JobSets, control_plane: ControlPlane, namespace: str
) -> None:
    """maxRestarts 2: SIGTERM, crash, disruption, crash run on (4 restarts, 2 counted); the
    next crash fails the JobSet."""
    jobset = _single_host(namespace, "manual__budget")
    ns, name = namespace, jobset["metadata"]["name"]
    jobsets.create(jobset)
    steps = [(143, False), (1, True), (None, False), (1, True)]
    counted = 0
    for attempt, (code, counts) in enumerate(steps):
        (pod,) = jobsets.running_pods(ns, name, 1, attempt=attempt)
        if code is None:
            control_plane.disrupt_pod(ns, pod["metadata"]["name"])
        else:
            control_plane.end_pod(ns, pod["metadata"]["name"], code)
        counted += counts
        after = jobsets.wait_status(
            ns, name, lambda st, n=attempt + 1: _restarted(st, n), f"restart {attempt + 1}"
        )
        assert int(after["status"].get("restartsCountTowardsMax") or 0) == counted, steps[attempt]
        assert condition(after["status"], "Failed") is None
    (pod,) = jobsets.running_pods(ns, name, 1, attempt=len(steps))
    control_plane.end_pod(ns, pod["metadata"]["name"], 1)
    done = jobsets.wait_status(ns, name, lambda st: condition(st, "Failed") is not None, "Failed")
    failed = condition(done["status"], "Failed")
    assert failed is not None
    assert failed["reason"] == "ReachedMaxRestarts", failed
    assert done["status"]["restarts"] == len(steps)
    assert interpret_status(done).phase == "Failed"
