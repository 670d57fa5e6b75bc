"""The JobSet rcpflow renders, on a real API server and the real JobSet, Job and scheduler
controllers: created with fieldValidation=Strict, admitted and defaulted, reconciled into
child Jobs and pods on the TPU v5p nodes its selectors name, and completed."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from k8s_real import JobSets, condition, render, settings

from devtools.k8s.control_plane import ControlPlane
from devtools.k8s.kwok_nodes import NODEPOOL_LABEL, TPU_RESOURCE, TPU_TOPOLOGY_LABEL
from tasks.backends.gke.render import JOBSET_COORDINATOR_ANNOTATION, JOBSET_UID_LABEL
from tasks.backends.gke.status import interpret_status


@pytest.fixture
def jobsets(kube: Any, control_plane: ControlPlane) -> JobSets:
    return JobSets(kube, control_plane)


def test_the_run_dags_multi_host_training_jobset_is_admitted(
    jobsets: JobSets, namespace: str
) -> None:
    """Found by the real JobSet webhook: JobSet (v0.10+) writes the coordinator
    '<name>-slice-0-0.<name>' into a label of the pods (<= 63 characters); the run DAG's names
    were 32 characters (75 for the label: v0.11+ refused the create with 422)."""
    rendered = render(settings(namespace), dag_id="mlperf_grpo_run")
    assert len(rendered["metadata"]["name"]) <= 26
    jobsets.create(rendered)


def test_rendered_training_jobset_is_admitted_defaulted_and_runs(
    jobsets: JobSets, control_plane: ControlPlane, namespace: str
) -> None:
    s = settings(namespace)
    rendered = render(s)
    name = rendered["metadata"]["name"]
    created = jobsets.create(copy.deepcopy(rendered))

    # Admitted as rendered: nothing the project sent was dropped, the cluster added defaults.
    spec = created["spec"]
    assert spec["failurePolicy"]["maxRestarts"] == 3
    assert spec["failurePolicy"]["rules"] == rendered["spec"]["failurePolicy"]["rules"]
    assert spec["coordinator"] == rendered["spec"]["coordinator"]
    assert spec["successPolicy"]["operator"] == "All"  # JobSet's defaulting webhook
    job = spec["replicatedJobs"][0]["template"]["spec"]
    rendered_job = rendered["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["podFailurePolicy"] == rendered_job["podFailurePolicy"]
    assert (
        job["template"]["spec"]["containers"][0]["command"]
        == (rendered_job["template"]["spec"]["containers"][0]["command"])
    )

    # Reconciled: one child Job (one slice) of 2 pods, scheduled on the 2x2x2 pool's hosts.
    pods = jobsets.running_pods(namespace, name, 2)
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert nodes == {"gke-tpu-v5p-2x2x2-a-0", "gke-tpu-v5p-2x2x2-a-1"}
    (child,) = jobsets.jobs(namespace, name)
    assert child.spec.backoff_limit == 0
    assert child.spec.completion_mode == "Indexed"
    assert [r.action for r in child.spec.pod_failure_policy.rules] == ["FailJob"] * 3
    assert child.metadata.owner_references[0].kind == "JobSet"
    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        assert annotations[JOBSET_COORDINATOR_ANNOTATION] == f"{name}-slice-0-0.{name}"
        assert pod["metadata"]["labels"][JOBSET_UID_LABEL] == created["metadata"]["uid"]
        assert pod["spec"]["containers"][0]["resources"]["limits"][TPU_RESOURCE] == "4"
        # GKE's ExtendedResourceToleration: the TPU pool's taint is tolerated
        assert any(t.get("key") == TPU_RESOURCE for t in pod["spec"]["tolerations"])
        assert pod["spec"]["hostNetwork"] is True
        assert pod["spec"]["subdomain"] == name  # JobSet's DNS hostnames

    running = interpret_status(jobsets.get(namespace, name))
    assert running.phase == "Running"

    for pod in pods:
        control_plane.end_pod(namespace, pod["metadata"]["name"], 0)
    done = jobsets.wait_status(
        namespace, name, lambda st: condition(st, "Completed") is not None, "Completed"
    )
    assert interpret_status(done).phase == "Succeeded"
    assert done["status"].get("restarts", 0) == 0


def test_rendered_evaluation_jobset_runs_one_job_per_worker_slice(
    jobsets: JobSets, control_plane: ControlPlane, namespace: str
) -> None:
    s = settings(namespace)
    rendered = render(s, role="evaluate", job="eval-18")
    name = rendered["metadata"]["name"]
    jobsets.create(rendered)
    pods = jobsets.running_pods(namespace, name, 2)
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert nodes == {"gke-tpu-v5p-2x2x1-a-0", "gke-tpu-v5p-2x2x1-b-0"}
    assert sorted(j.metadata.name for j in jobsets.jobs(namespace, name)) == [
        f"{name}-slice-0",
        f"{name}-slice-1",
    ]
    for pod in pods:
        control_plane.end_pod(namespace, pod["metadata"]["name"], 0)
    jobsets.wait_status(
        namespace, name, lambda st: condition(st, "Completed") is not None, "Completed"
    )


def test_strict_field_validation_refuses_an_unknown_field(jobsets: JobSets, namespace: str) -> None:
    import kubernetes

    rendered = render(settings(namespace))
    rendered["spec"]["replicatedJobs"][0]["template"]["spec"]["backofLimit"] = 0  # misspelt
    with pytest.raises(kubernetes.client.ApiException) as refused:
        jobsets.create(copy.deepcopy(rendered))
    assert refused.value.status == 400
    message = json.loads(refused.value.body)["message"]
    assert (
        'strict decoding error: unknown field "spec.replicatedJobs[0].template.spec.backofLimit"'
        in message
    )
    # Without strict validation the API server prunes it silently: why the project is strict.
    created = jobsets.create(rendered, strict=False)
    assert "backofLimit" not in created["spec"]["replicatedJobs"][0]["template"]["spec"]


def test_a_shape_no_node_pool_has_stays_pending(
    jobsets: JobSets, control_plane: ControlPlane, namespace: str
) -> None:
    # 2x2x4: 4 hosts of a topology no node has; the scheduler leaves the pods Pending (JobSet's
    # exclusive placement admits the other pods of the slice only once pod 0 is scheduled).
    from k8s_real import shape

    s = settings(namespace, train=shape("2x2x4"))
    rendered = render(s, run_id="manual__pending")
    name = rendered["metadata"]["name"]
    jobsets.create(rendered)

    def unschedulable() -> list[dict[str, Any]] | None:
        pods = jobsets.pods(namespace, name)
        reasons = [
            c.get("reason")
            for p in pods
            for c in (p.get("status") or {}).get("conditions") or []
            if c.get("type") == "PodScheduled"
        ]
        return pods if pods and reasons == ["Unschedulable"] * len(pods) else None

    pods = control_plane.wait_for(unschedulable, what="unschedulable pods", timeout_s=60)
    selector = pods[0]["spec"]["nodeSelector"]
    assert selector[TPU_TOPOLOGY_LABEL] == "2x2x4"
    assert NODEPOOL_LABEL not in selector
