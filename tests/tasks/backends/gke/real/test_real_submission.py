"""A whole submission on the real control plane: the rehearsal deployment
(docker/deployment.rehearsal.toml) on the GKE backend, three seeds under a real Airflow
scheduler on 127.0.0.1, every job a JobSet the real JobSet controller runs on kwok's TPU v5p
nodes, each pod's container run here by `devtools.k8s.kwok_pods.PodRunner` and completed
by kwok with its process's exit code. The cluster is reached through a Kubernetes connection
(a kubeconfig of a service account whom RBAC grants what docs/gke.md lists), the path a
deployment without the GKE lookup takes (`gke.kubernetes_conn_id`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_real import DOCUMENTED_RULES, JobSets, fresh_namespace
from repo_paths import REPO

from devtools.k8s.binaries import JOBSET_VERSIONS
from devtools.k8s.control_plane import ControlPlane
from devtools.k8s.kwok_nodes import TpuNodePool
from devtools.k8s.kwok_pods import PodRunner
from devtools.servers.airflow_server import LocalAirflow, repo_config
from rcpflow.files.layout import RunLayout
from rcpflow.planning.rehearsal import load_curve
from rcpflow.records.manifest import load
from rcpflow.records.mllog import read_events
from tasks.backends.gke.render import JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION
from tasks.names import RUN_DAG_ID, SUBMISSION_DAG_ID
from tasks.results.verdicts import read_verdict

CONN_ID = "rcp_kwok"
ACCOUNT = "rcpflow-airflow"
SEEDS = (1, 2, 3)
CURVE = load_curve(str(REPO / "tpu_jobs" / "rehearsal" / "curve.csv"))
CONF = {"global_batch_size": 256, "max_steps": 26, "val_start_at": None}  # validation from 18
# One single-host slice per pool (the JobSet's exclusive topology takes a whole pool): three
# trainings and their evaluations at once.
POOLS = tuple(TpuNodePool(f"tpu-v5p-2x2x1-{c}", "2x2x1", 1) for c in "abcdefgh")
SYSTEM = {
    "system_name": "kwok-tpu-v5p-rehearsal",
    "accelerator_model_name": "TPU v5p (kwok, simulated)",
    "accelerators_per_node": "4",
}


# Both roles: one single-host v5p slice, requests a kwok node always has.
SHAPE = """accelerator = "tpu-v5p-slice"
topology = "2x2x1"
slices = 1
chips_per_host = 4
max_restarts = 1
termination_grace_period_s = 10
cpu_request = "1"
memory_request = "1Gi"
"""


def gke_rehearsal_deployment(storage_root: Path, namespace: str) -> str:
    """The shipped rehearsal deployment on the GKE backend: its [jobs] tables as they are
    (with an image each), a [gke] table of single-host v5p slices in `namespace`."""
    text = (REPO / "docker" / "deployment.rehearsal.toml").read_text()
    head, jobs = text.split("[jobs.train]", 1)
    assert 'backend = "local"' in head
    image = '\nimage = "rcpflow-rehearsal:test"\n'
    jobs = jobs.replace("\n]\n", "\n]" + image, 2)
    assert jobs.count(image) == 2
    return f"""
backend = "gke"
storage_root = {json.dumps(str(storage_root))}
eval_window = 2
train_timeout_minutes = 20
eval_timeout_minutes = 10

[gke]
kubernetes_conn_id = "{CONN_ID}"
namespace = "{namespace}"
image = "rcpflow-rehearsal:test"
poll_interval_s = 1.0
backoff_max_s = 5.0
ttl_after_finished_s = 600

[gke.train]
{SHAPE}
[gke.evaluate]
{SHAPE}

[jobs.train]{jobs}"""


@pytest.fixture(params=JOBSET_VERSIONS)
def plane(planes: Any, request: pytest.FixtureRequest) -> ControlPlane:
    """The control plane with eight single-host pools, per JobSet version (the README's
    minimum and the newest)."""
    plane: ControlPlane = planes(request.param, pools=POOLS)
    return plane


@pytest.fixture
def kwok_namespace(plane: ControlPlane) -> Iterator[str]:
    with fresh_namespace(plane) as name:
        yield name


def _connection_kubeconfig(plane: ControlPlane, namespace: str) -> Path:
    """A kubeconfig of a service account with only the rights docs/gke.md lists."""
    plane.api.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": ACCOUNT, "namespace": namespace},
        }
    )
    subject = {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}
    plane.grant(f"rcpflow-airflow-{namespace}", DOCUMENTED_RULES, subject)
    return plane.service_account_kubeconfig(namespace, ACCOUNT)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_rehearsal_submission_passes_every_checker_on_the_control_plane(
    plane: ControlPlane, kwok_namespace: str, tmp_path: Path
) -> None:
    namespace = kwok_namespace
    deployment = tmp_path / "deployment.toml"
    deployment.write_text(gke_rehearsal_deployment(tmp_path / "runs", namespace))
    kubeconfig = _connection_kubeconfig(plane, namespace)
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}
    env = {
        "RCPFLOW_DEPLOYMENT": str(deployment),
        f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(conn),
        "PYTHONPATH": str(REPO),
    }
    conf = {
        **CONF,
        "seeds": list(SEEDS),
        "target": 0.69,
        "division": "open",
        "backend": "gke",
        "storage_root": str(tmp_path / "runs"),
        "submission_name": "kwok",
        "system": SYSTEM,
    }
    runner = PodRunner(plane, namespace, workdir=REPO, log_dir=tmp_path / "pods")
    airflow = LocalAirflow(repo_config(tmp_path / "airflow", parallelism=4, env=env))
    with runner, airflow:
        for dag_id in (RUN_DAG_ID, SUBMISSION_DAG_ID):
            airflow.wait_for_dag(dag_id)
        run_id = airflow.trigger(SUBMISSION_DAG_ID, conf)
        state = airflow.wait_for_run(SUBMISSION_DAG_ID, run_id, timeout_s=1200)
        states = {(t["task_id"], t["map_index"]): t["state"] for t in airflow.task_instances(
            SUBMISSION_DAG_ID, run_id
        )}  # fmt: skip
        runs = {seed: airflow.dag_run(RUN_DAG_ID, f"kwok__seed_{seed}")["state"] for seed in SEEDS}

        # Nothing of the runs is left on the cluster: every JobSet was torn down, with its
        # Jobs and pods.
        jobsets = JobSets.for_plane(plane)

        def empty() -> bool | None:
            listed = jobsets.custom.list_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL
            )
            left = (
                listed["items"]
                or jobsets.batch.list_namespaced_job(namespace).items
                or plane.pods(namespace)
            )
            return None if left else True

        plane.wait_for(
            empty, what=f"namespace {namespace} empty of JobSets, Jobs and pods", timeout_s=120
        )

    assert runner.errors == []
    assert state == "success", states
    assert runs == {seed: "success" for seed in SEEDS}
    out = tmp_path / "runs" / "kwok"
    for seed in SEEDS:
        run_dir = out / "runs" / f"seed_{seed}"
        layout = RunLayout(str(run_dir))
        rows = load(layout.manifest).rows
        passing = CURVE.first_pass(seed, 18, CONF["max_steps"])
        assert passing is not None
        (stop,) = [e for e in read_events(layout.mllog(seed)) if e.key == "run_stop"]
        assert stop.metadata["status"] == "success"
        assert stop.time_ms == next(r.timestamp_ms for r in rows if r.step == passing)
        verdict = read_verdict(str(run_dir), "compliance_checker")
        assert verdict is not None and verdict.ok, verdict
    # One training pod per seed and one pod per evaluated step ran here; each ended with the
    # job's own exit code: 0, or 143 for a higher step's evaluation deleted at a pass.
    trainings = [code for pod, code in runner.exits if "-train-" in pod]
    assert trainings == [0, 0, 0], runner.exits
    assert {code for _, code in runner.exits} <= {0, 143}, runner.exits
    for tool in ("rcp_checker", "package_checker", "result_summarizer"):
        verdict = read_verdict(str(out), tool)
        assert verdict is not None and verdict.ok, verdict
    assert "**Verdict: PASS**" in (out / "report.md").read_text()
