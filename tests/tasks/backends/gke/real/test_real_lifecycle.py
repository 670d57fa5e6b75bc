"""The one job lifecycle's suite (tests/tasks/backend_api/lifecycle_suite.py) on the GKE driver
against the real control plane (conftest.py): every job a JobSet the real JobSet controller runs
on kwok's TPU v5p nodes, its pod's container run here by `devtools.k8s.kwok_pods.PodRunner`
(the "ok" and "fail" jobs really end, with their exit codes; the "long" one runs until its
JobSet is deleted), the cluster reached through a Kubernetes connection whose service account
has only what docs/gke.md lists. Where the GKE driver answers differently by design, the test
is overridden here with the GKE truth (its docstring says why): a failing job is a Failed
JobSet (the restarts are the JobSet's failurePolicy, on the cluster), and the foreign job of
our name is a JobSet someone deleted and created again under the task's name."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from k8s_real import (
    JobSets,
    connection_kubeconfig,
    settings,
    shape,
)
from repo_paths import REPO

from devtools.k8s.control_plane import ControlPlane
from devtools.k8s.kwok_pods import PodRunner
from tasks.backend_api.job_operator import JobReplacedError
from tasks.backend_api.lifecycle_names import ENDED, JOB_RECORD_KEY
from tasks.backend_api.protocol import JobRequest
from tasks.backend_api.teardown import CancelRecordedJobs
from tasks.backends.gke.adapter import jobset_hook
from tasks.backends.gke.driver import GkeDriver
from tasks.backends.gke.render import (
    JOBSET_GROUP,
    JOBSET_PLURAL,
    JOBSET_VERSION,
    render_jobset,
)
from tasks.backends.gke.status import interpret_status

sys.path.insert(0, str(Path(__file__).parents[3] / "backend_api"))
from lifecycle_suite import (  # tests/tasks/backend_api
    Case,
    LifecycleSuite,
    TaskInstance,
    context_of,
    first_event,
    operator_for,
    start,
    until_ended,
)

CONN_ID = "rcp_lifecycle"
ARGV = {
    "ok": ("python", "-c", "print('ok')"),
    "fail": ("python", "-c", "import sys; print('failing'); sys.exit(1)"),
    "long": ("python", "-c", "import time; time.sleep(300)"),
}
# A foreign JobSet of our name: rendered from another spec (another command).
FOREIGN_ARGV = ("python", "-c", "import time; time.sleep(301)")


@pytest.fixture
def jobsets(kube: Any, control_plane: ControlPlane) -> JobSets:
    return JobSets(kube, control_plane)


def _alive(jobsets: JobSets, ref: Mapping[str, Any]) -> bool:
    """The JobSet of `ref` still runs: it exists, is the object of the reference's UID (where
    it has one), is not being deleted and has not finished."""
    import kubernetes

    try:
        found = jobsets.get(ref["namespace"], ref["name"])
    except kubernetes.client.exceptions.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    metadata = found["metadata"]
    if ref.get("uid") is not None and metadata["uid"] != ref["uid"]:
        return False
    return not metadata.get("deletionTimestamp") and not interpret_status(found).terminal


class TestGkeDriverLifecycle(LifecycleSuite):
    @pytest.fixture
    def case(
        self,
        control_plane: ControlPlane,
        namespace: str,
        jobsets: JobSets,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> Iterator[Case]:
        kubeconfig = connection_kubeconfig(control_plane, namespace)
        conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
        one_host = shape("2x2x1", max_restarts=0)  # one pod per JobSet; no restart
        s = settings(
            namespace, train=one_host, evaluate=one_host, kubernetes_conn_id=CONN_ID,
            poll_interval_s=0.2, backoff_max_s=1.0, outage_budget_s=5.0,
        )  # fmt: skip

        def foreign(request: JobRequest) -> Mapping[str, Any]:
            body = render_jobset(
                s, role=request.role, dag_id=request.dag_id, run_id=request.run_id,
                job=request.label, command=FOREIGN_ARGV,
            )  # fmt: skip
            created = jobsets.create(body)
            meta = created["metadata"]
            return {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]}

        runner = PodRunner(control_plane, namespace, workdir=REPO, log_dir=tmp_path / "pods")
        with runner:
            yield Case(
                driver=GkeDriver(s),
                argv=ARGV.__getitem__,
                alive=lambda ref: _alive(jobsets, ref),
                foreign=foreign,
                run_dir=str(tmp_path / "run"),
                dag_id="lifecycle",
                run_id=f"run-{uuid.uuid4().hex[:12]}",
            )
            # what a test left runs no longer (the namespace goes next)
            for item in jobsets.custom.list_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL
            )["items"]:
                jobsets.custom.delete_namespaced_custom_object(
                    JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL,
                    item["metadata"]["name"],
                )  # fmt: skip
        assert runner.errors == []

    def test_a_job_that_fails_fails_its_task_naming_it_and_quoting_its_output(
        self, case: Case
    ) -> None:
        """GKE: a JobSet's restarts are its failurePolicy's, on the cluster (none here,
        max_restarts 0), so a Failed JobSet is `fail_now`: its task fails without retries. The
        error names the JobSet and its failed pods with their exit codes (the state's detail);
        there is no output tail (a pod's log is the cluster's, not the driver's to fetch)."""
        ti = TaskInstance()
        op = operator_for(case, "fail")
        event = until_ended(start(case, op, ti))
        assert event["state"]["outcome"] == "fail_now", event
        with pytest.raises(AirflowFailException) as failed:
            op.execute_complete(context_of(case, ti), event)
        message = str(failed.value)
        assert message.startswith(case.driver.describe(event["ref"]))
        assert "failed pod " in message and "exit code 1" in message, message
        assert "last output lines" not in message
        assert ti.xcoms[JOB_RECORD_KEY]["cancel"] is True

    def test_a_foreign_job_of_our_name_is_never_adopted_nor_cancelled(
        self, case: Case, jobsets: JobSets, control_plane: ControlPlane
    ) -> None:
        """GKE: a JobSet's name is its DAG run's and label's, so the foreign job of our name is
        one someone deleted and created again under it (or created first). The reference
        carries the UID of the object the task created, and every delete carries it as the
        API's precondition: the watch names the other object foreign (Replaced), and cancel,
        on_kill and the teardown leave it running. A retry finds a JobSet of its name that
        was not rendered from its spec and refuses it (a retryable error: the name may be
        freed), recording it left: never adopted."""
        import kubernetes

        ti = TaskInstance()
        op = operator_for(case, "long")
        trigger = start(case, op, ti)
        ref = trigger.ref
        assert ref["uid"] and case.alive(ref)
        jobsets.custom.delete_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, ref["namespace"], JOBSET_PLURAL, ref["name"]
        )

        def gone() -> bool | None:
            try:
                jobsets.get(ref["namespace"], ref["name"])
            except kubernetes.client.exceptions.ApiException as exc:
                return True if exc.status == 404 else None
            return None

        control_plane.wait_for(gone, what=f"JobSet {ref['name']} deleted", timeout_s=60)
        foreign = case.foreign(op.request(context_of(case, ti)))
        assert foreign["name"] == ref["name"] and foreign["uid"] != ref["uid"]

        assert case.driver.cancel(ref) is False
        # and the apiserver's own check, for a replacement between a read and the delete
        driver = case.driver
        assert isinstance(driver, GkeDriver)
        hook = jobset_hook(driver.cluster)
        assert hook.delete_jobset(ref["namespace"], ref["name"], ref["uid"]) is False
        op.on_kill()  # the task's own JobSet is gone: nothing of the name is deleted
        teardown = CancelRecordedJobs(driver=case.driver, run_task_id="run")
        done = teardown.execute(context_of(case, ti))  # the task ended without deciding
        assert done == [{"job": case.driver.describe(ref), "cancelled": False}]
        assert case.alive(foreign)

        event = first_event(trigger)
        assert event["phase"] == ENDED, event
        assert (event["state"]["outcome"], event["state"]["reason"]) == ("foreign", "Replaced")
        with pytest.raises(JobReplacedError):
            op.execute_complete(context_of(case, ti), event)
        assert ti.xcoms[JOB_RECORD_KEY]["cancel"] is False

        retry = TaskInstance(try_number=2)
        with pytest.raises(AirflowException, match="not rendered from this spec") as refused:
            operator_for(case, "long").execute(context_of(case, retry))
        assert not isinstance(refused.value, AirflowFailException)
        assert retry.xcoms[JOB_RECORD_KEY]["cancel"] is False  # left: never the task's
        assert case.alive(foreign)
        # what tells the two apart is the UID alone: the object of its own is cancelled
        assert case.driver.cancel(foreign) is True and not case.alive(foreign)
