"""Kueue's real controller (when it was built) with the GKE backend's queued JobSets: created
suspended with the queue label, admitted by a ClusterQueue with a TPU v5p flavour (Kueue
unsuspends it and the pods run on the flavour's nodes); queued on a LocalQueue nothing
serves, it stays suspended and the project's trigger fails it after `max_suspended_s`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_real import JobSets, condition, fresh_namespace, render, settings, shape

from devtools.k8s.binaries import NEWEST_JOBSET
from devtools.k8s.control_plane import ControlPlane
from devtools.k8s.errors import BinariesMissing
from devtools.k8s.kwok_nodes import TPU_ACCELERATOR_LABEL, TPU_RESOURCE
from tasks.backends.gke.status import interpret_status

QUEUE = "tpu"


@pytest.fixture(scope="module")
def kueue_plane(planes: Any, k8s_bin: Path) -> ControlPlane:
    if not (k8s_bin / "kueue").is_file():
        why = (
            (k8s_bin / "KUEUE_FAILED").read_text()[-500:]
            if (k8s_bin / "KUEUE_FAILED").is_file()
            else ""
        )
        pytest.skip(f"Kueue's controller did not build ({k8s_bin}/KUEUE_FAILED): {why}")
    try:
        plane: ControlPlane = planes(NEWEST_JOBSET, kueue=True)
    except BinariesMissing as exc:
        pytest.skip(str(exc))
    api = plane.api
    api.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "tpu-v5p"},
            "spec": {"nodeLabels": {TPU_ACCELERATOR_LABEL: "tpu-v5p-slice"}},
        }
    )
    api.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": "tpu-v5p"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", TPU_RESOURCE],
                        "flavors": [
                            {
                                "name": "tpu-v5p",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "800"},
                                    {"name": "memory", "nominalQuota": "1600Gi"},
                                    {"name": TPU_RESOURCE, "nominalQuota": "16"},
                                ],
                            }
                        ],
                    }
                ],
            },
        }
    )
    return plane


@pytest.fixture
def namespace(kueue_plane: ControlPlane) -> Iterator[str]:
    with fresh_namespace(kueue_plane) as name:
        kueue_plane.api.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": QUEUE, "namespace": name},
                "spec": {"clusterQueue": "tpu-v5p"},
            }
        )
        yield name


def test_a_queued_jobset_is_admitted_by_a_tpu_cluster_queue(
    kueue_plane: ControlPlane, namespace: str
) -> None:
    jobsets = JobSets.for_plane(kueue_plane)
    s = settings(namespace, queue_name=QUEUE, train=shape("2x2x2"))
    jobset = render(s, run_id="manual__kueue")
    assert jobset["spec"]["suspend"] is True
    name = jobset["metadata"]["name"]
    jobsets.create(jobset)
    pods = jobsets.running_pods(namespace, name, 2, timeout_s=120)
    admitted = jobsets.get(namespace, name)
    assert admitted["spec"]["suspend"] is False  # Kueue unsuspended it
    assert interpret_status(admitted).suspended is False
    assert {p["spec"]["nodeName"] for p in pods} == {
        "gke-tpu-v5p-2x2x2-a-0",
        "gke-tpu-v5p-2x2x2-a-1",
    }
    workloads = kueue_plane.api.get(
        f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/workloads"
    )
    assert len(workloads["items"]) == 1
    for pod in pods:
        kueue_plane.end_pod(namespace, pod["metadata"]["name"], 0)
    jobsets.wait_status(
        namespace, name, lambda st: condition(st, "Completed") is not None, "Completed"
    )


def test_a_jobset_never_admitted_fails_after_max_suspended(
    kueue_plane: ControlPlane, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from tasks.backend_api.job_state import JobState
    from tasks.backend_api.watch_trigger import WatchTrigger
    from tasks.backends.gke.driver import GkeDriver

    jobsets = JobSets.for_plane(kueue_plane)
    s = settings(namespace, queue_name="nobody-serves-this", train=shape("2x2x1"))
    jobset = render(s, run_id="manual__kueue_never")
    name = jobset["metadata"]["name"]
    created = jobsets.create(jobset)
    status = jobsets.wait_status(
        namespace,
        name,
        lambda st: condition(st, "Suspended") is not None,
        "Suspended",
        timeout_s=60,
    )
    assert interpret_status(status).suspended
    assert jobsets.pods(namespace, name) == []

    # the project's watch and driver, reading the real JobSet through a kubeconfig-less
    # stand-in of the hook (the GKE connection path is test_real_hooks.py's): the suspended
    # clock runs out
    class Reader:
        async def get_jobset(self, ns: str, jobset_name: str) -> dict[str, Any]:
            return await asyncio.to_thread(jobsets.get, ns, jobset_name)

    async def reader(self: GkeDriver) -> Reader:
        return Reader()

    monkeypatch.setattr(GkeDriver, "_hook", reader)

    async def events() -> list[dict[str, Any]]:
        state: dict[str, Any] = {
            "driver": "gke",
            "driver_args": GkeDriver(s).args(),
            "ref": {"name": name, "namespace": namespace},
            "memo": {
                "uid": created["metadata"]["uid"],
                "running_since": None,
                "suspended_since": None,
                "max_suspended_s": 3.0,
            },
            "poll_interval_s": 0.5,
        }
        seen: list[dict[str, Any]] = []
        while True:
            async for event in WatchTrigger(**json.loads(json.dumps(state))).run():
                seen.append(event.payload)
            if seen[-1]["phase"] != "watching":
                return seen
            state = seen[-1]["kwargs"]

    seen = asyncio.run(asyncio.wait_for(events(), timeout=60))
    # the first read started the suspended clock (a change the next defer persists)
    assert seen[0]["phase"] == "watching" and seen[0]["kwargs"]["memo"]["suspended_since"]
    last = seen[-1]
    assert last["phase"] == "ended", last
    state = JobState.from_json(last["state"])
    assert (state.outcome, state.reason) == ("fail_now", "SuspendedTooLong"), state
    assert "not admitted" in state.line
    # the watch gave up on it; the cluster has not failed it: the teardown deletes it
    assert interpret_status(jobsets.get(namespace, name)).suspended
