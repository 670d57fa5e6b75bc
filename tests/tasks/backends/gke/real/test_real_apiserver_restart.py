"""A training JobSet while the real API server is stopped and started again: a watch of it
ends, nothing is changed meanwhile (same UID, spec, no restart), the controllers and kwok
reconnect and carry on, and a watch resumes from its last resource version or, told 410 Gone,
from a fresh list. A JobSet deleted and created again under its name has another UID."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from k8s_real import JobSets, condition, render, settings, shape

from devtools.k8s.control_plane import ControlPlane
from tasks.backends.gke.render import JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION

DOWN_S = 20.0


@pytest.fixture
def jobsets(kube: Any, control_plane: ControlPlane) -> JobSets:
    return JobSets(kube, control_plane)


class Watcher(threading.Thread):
    """Watches JobSets of one namespace from `resource_version`; records events and how the
    watch ended."""

    def __init__(self, kube: Any, namespace: str, resource_version: str) -> None:
        super().__init__(daemon=True)
        import kubernetes

        self.custom = kubernetes.client.CustomObjectsApi(kube)
        self.watch = kubernetes.watch.Watch()
        self.namespace = namespace
        self.resource_version = resource_version
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.ended: BaseException | str | None = None

    def run(self) -> None:
        try:
            for event in self.watch.stream(
                self.custom.list_namespaced_custom_object,
                JOBSET_GROUP,
                JOBSET_VERSION,
                self.namespace,
                JOBSET_PLURAL,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=300,
                _request_timeout=(5, 310),
            ):
                obj = event["object"]
                self.events.append((event["type"], obj))
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    self.resource_version = rv
            self.ended = "stream closed"
        except BaseException as exc:  # the outcome under test: any ending is recorded
            self.ended = exc

    def stop(self) -> None:
        self.watch.stop()


def test_a_watch_across_an_api_server_restart(
    jobsets: JobSets, control_plane: ControlPlane, kube: Any, namespace: str
) -> None:
    import kubernetes

    s = settings(namespace, train=shape("2x2x1", max_restarts=3))
    jobset = render(s, run_id="manual__outage")
    ns, name = namespace, jobset["metadata"]["name"]
    created = jobsets.create(jobset)
    (pod,) = jobsets.running_pods(ns, name, 1)
    before = jobsets.get(ns, name)

    watcher = Watcher(kube, ns, before["metadata"]["resourceVersion"])
    watcher.start()
    time.sleep(1.0)
    control_plane.stop_apiserver()
    watcher.join(timeout=30)
    assert not watcher.is_alive(), "the watch did not end when the API server stopped"
    assert watcher.ended is not None
    with pytest.raises(Exception) as down:  # any connection error: the server is gone
        jobsets.get(ns, name)
    assert "refused" in str(down.value).lower() or "max retries" in str(down.value).lower()

    time.sleep(DOWN_S)
    control_plane.start_apiserver()

    after = jobsets.get(ns, name)
    assert after["metadata"]["uid"] == created["metadata"]["uid"]
    assert after["spec"] == before["spec"]
    assert int((after.get("status") or {}).get("restarts") or 0) == 0
    assert condition(after.get("status") or {}, "Failed") is None
    (still,) = jobsets.running_pods(ns, name, 1)
    assert still["metadata"]["uid"] == pod["metadata"]["uid"]

    # Resume the watch where it was; a 410 Gone (the new server's watch cache starts later)
    # means list again and watch from the list's version.
    resumed = Watcher(kube, ns, watcher.resource_version)
    resumed.start()
    time.sleep(2.0)
    gone = [
        e
        for e in resumed.events
        if e[0] == "ERROR" and (e[1].get("code") == 410 or e[1].get("reason") == "Expired")
    ]
    if gone or (
        isinstance(resumed.ended, kubernetes.client.ApiException) and resumed.ended.status == 410
    ):
        resumed.stop()
        listed = jobsets.custom.list_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, ns, JOBSET_PLURAL
        )
        assert [i["metadata"]["uid"] for i in listed["items"]] == [created["metadata"]["uid"]]
        resumed = Watcher(kube, ns, listed["metadata"]["resourceVersion"])
        resumed.start()
    # The controllers are back: ending the pod completes the JobSet, and the watch sees it.
    control_plane.end_pod(ns, pod["metadata"]["name"], 0)

    def completed_seen() -> bool | None:
        for kind, obj in resumed.events:
            if kind == "MODIFIED" and condition(obj.get("status") or {}, "Completed"):
                return True
        return None

    control_plane.wait_for(completed_seen, what="the resumed watch sees Completed", timeout_s=90)
    resumed.stop()


def test_a_jobset_created_again_under_its_name_has_another_uid(
    jobsets: JobSets, namespace: str
) -> None:
    jobset = render(settings(namespace, train=shape("2x2x1")), run_id="manual__replaced")
    ns, name = namespace, jobset["metadata"]["name"]
    first = jobsets.create(dict(jobset))
    jobsets.delete(ns, name)

    def gone() -> bool | None:
        import kubernetes

        try:
            jobsets.get(ns, name)
        except kubernetes.client.ApiException as exc:
            return True if exc.status == 404 else None
        return None

    jobsets.plane.wait_for(gone, what=f"JobSet {name} deleted", timeout_s=60)
    second = jobsets.create(dict(jobset))
    assert second["metadata"]["name"] == name
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
