"""Multi-host evaluation workers on GKE: each slice of the evaluate JobSet is one worker and one
`jax.distributed` system of its own hosts (tests/tpu_jobs/eval/test_multihost_eval.py runs such a
worker on CPU processes); the Tunix evaluator, one process per worker, is refused such a shape
when the deployment is parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_gke_jobset import kubernetes_expand

from tasks.backends.gke.render import (
    ANNOTATION_EXCLUSIVE_TOPOLOGY,
    COORDINATOR_ADDRESS_ENV,
    COORDINATOR_HOST_ENV,
    NUM_PROCESSES_ENV,
    PROCESS_ID_ENV,
    render_jobset,
)
from tasks.backends.gke.settings import GkeSettings, check_evaluate_job
from tasks.deployment import DeploymentError, parse_deployment
from tasks.settings import read_table

RUN_ID = "manual__2026-05-01T12:00:00.123456+00:00"
TOY = ["python", "-m", "tpu_jobs.evaluate", "--run-dir", "gs://b/runs/s1", "--step", "18"]
TUNIX = ["python", "-m", "tpu_jobs.tunix_evaluate", "--run-dir", "gs://b/runs/s1", "--step", "18"]
# 4 workers of one 2x2x2 v5p slice each: 2 hosts of 4 chips per worker.
MULTI_HOST_EVAL = {"evaluate": {"topology": "2x2x2", "slices": 4, "chips_per_host": 4}}


def _settings(table: dict[str, Any] = MULTI_HOST_EVAL) -> GkeSettings:
    return read_table(GkeSettings, table, "gke")


def _render(settings: GkeSettings, command: list[str] = TOY) -> dict[str, Any]:
    return render_jobset(
        settings,
        role="evaluate",
        dag_id="mlperf_grpo_run",
        run_id=RUN_ID,
        job="eval-18",
        command=command,
    )


def _pod(jobset: dict[str, Any]) -> dict[str, Any]:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_a_multi_host_eval_shape_is_accepted() -> None:
    shape = _settings().evaluate
    assert (shape.hosts_per_slice, shape.slices, shape.multi_host) == (2, 4, True)


def test_the_multi_host_eval_jobset_passes_the_crd_schema(strict_jobset, lenient_jobset) -> None:
    jobset = _render(_settings())
    assert strict_jobset.errors(jobset) == []
    assert lenient_jobset.errors(jobset) == []


def test_each_slice_is_one_distributed_system_of_its_own_hosts() -> None:
    jobset = _render(_settings())
    name = jobset["metadata"]["name"]
    rjob = jobset["spec"]["replicatedJobs"][0]
    assert rjob["replicas"] == 4  # one child Job per worker
    job = rjob["template"]["spec"]
    assert (job["parallelism"], job["completions"], job["completionMode"]) == (2, 2, "Indexed")
    pod = _pod(jobset)
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert jobset["spec"]["network"] == {
        "enableDNSHostnames": True,
        "publishNotReadyAddresses": True,
    }
    assert jobset["metadata"]["annotations"][ANNOTATION_EXCLUSIVE_TOPOLOGY] == (
        "cloud.google.com/gke-nodepool"
    )
    # spec.coordinator names one pod for the whole JobSet: right for training, wrong for 4
    # independent workers.
    assert "coordinator" not in jobset["spec"]

    env = pod["containers"][0]["env"]
    by_name = {e["name"]: e for e in env}
    names = [e["name"] for e in env]
    # $(VAR) expands only from variables defined above it.
    assert names.index("RCPFLOW_SLICE_INDEX") < names.index(COORDINATOR_HOST_ENV)
    assert names.index(COORDINATOR_HOST_ENV) < names.index(COORDINATOR_ADDRESS_ENV)
    assert by_name[NUM_PROCESSES_ENV]["value"] == "2"  # the worker's hosts, not all 8 pods
    assert by_name[PROCESS_ID_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    assert by_name["RCPFLOW_NUM_SLICES"]["value"] == "4"
    for slice_index in range(4):
        # What the kubelet makes of the variables in the pods of Job `slice_index`: pod 0 of
        # that same Job, by the hostname JobSet gives it in its headless service's subdomain.
        values = {"RCPFLOW_SLICE_INDEX": str(slice_index)}
        host = kubernetes_expand(by_name[COORDINATOR_HOST_ENV]["value"], values)
        values[COORDINATOR_HOST_ENV] = host
        address = kubernetes_expand(by_name[COORDINATOR_ADDRESS_ENV]["value"], values)
        assert address == f"{name}-slice-{slice_index}-0.{name}:8476"


def test_single_host_workers_stay_independent_processes() -> None:
    pod = _pod(_render(GkeSettings()))
    names = {e["name"] for e in pod["containers"][0]["env"]}
    assert not names & {COORDINATOR_ADDRESS_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV}
    assert "hostNetwork" not in pod


def test_the_tunix_evaluator_is_refused_a_multi_host_shape_naming_why() -> None:
    with pytest.raises(DeploymentError) as excinfo:
        check_evaluate_job(_settings(), TUNIX, "d.toml")
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith("d.toml: gke.evaluate.topology: 2x2x2 has 2 hosts per slice")
    assert "jobs.evaluate runs the Tunix evaluator (tpu_jobs.tunix_evaluate)" in message
    script = ["python", "/opt/rcpflow/tpu_jobs/tunix_evaluate.py", "--step", "18"]
    with pytest.raises(DeploymentError):
        check_evaluate_job(_settings(), script, "d.toml")
    check_evaluate_job(_settings(), TOY, "d.toml")  # the toy evaluator runs multi-host
    check_evaluate_job(GkeSettings(), TUNIX, "d.toml")  # single-host workers: one process


def test_the_refusal_comes_when_the_dag_builds_its_driver(tmp_path: Path) -> None:
    pytest.importorskip("airflow")
    from tasks.backend_api.protocol import driver_for
    from tasks.backends.registry import registered

    assert "gke" in registered()
    text = (
        'backend = "gke"\n[gke]\nimage = "i:1"\n'
        '[gke.evaluate]\ntopology = "2x2x2"\nslices = 4\nchips_per_host = 4\n'
        '[jobs.evaluate]\ncommand = ["{python}", "-m", "tpu_jobs.tunix_evaluate", '
        '"--run-dir", "{run_dir}", "--step", "{step}"]\n'
    )
    deployment = parse_deployment(text, source="f.toml", base_dir=tmp_path)
    with pytest.raises(DeploymentError, match=r"^f.toml: gke.evaluate.topology: 2x2x2 has 2"):
        driver_for(deployment)
    toy = parse_deployment(text.split("[jobs.evaluate]")[0], source="f.toml", base_dir=tmp_path)
    assert driver_for(toy).name == "gke"
