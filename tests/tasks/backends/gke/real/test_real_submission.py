"""A whole submission on the real control plane: the rehearsal deployment
(docker/deployment.rehearsal.toml) on the GKE backend, three seeds under a real Airflow
scheduler on 127.0.0.1, every job a JobSet the real JobSet controller runs on kwok's TPU v5p
nodes, each pod's container run here by `devtools.k8s.kwok_pods.PodRunner` and completed
by kwok with its process's exit code. The cluster is reached through a Kubernetes connection
(a kubeconfig of a service account whom RBAC grants what docs/gke.md lists), the path a
deployment without the GKE lookup takes (`gke.kubernetes_conn_id`).

The submission runs on the newest JobSet; on the oldest the README supports, one seed's run
DAG: every JobSet call of a submission is a run's (the training's, each evaluation's, the
deletion at the pass), and the submission's own tasks never reach the cluster."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_real import (
    CONF,
    POOLS,
    SEEDS,
    airflow_env,
    fresh_namespace,
    gke_rehearsal_deployment,
    rehearsal_conf,
    wait_namespace_empty,
)
from repo_paths import REPO

from devtools.k8s.binaries import NEWEST_JOBSET, OLDEST_JOBSET
from devtools.k8s.control_plane import ControlPlane
from devtools.k8s.kwok_pods import PodRunner
from devtools.servers.airflow_server import LocalAirflow, repo_config
from rcpflow.files.layout import RunLayout
from rcpflow.planning.rehearsal import load_curve
from rcpflow.records.manifest import load
from rcpflow.records.mllog import read_events
from tasks.names import RUN_DAG_ID, SUBMISSION_DAG_ID
from tasks.results.verdicts import read_verdict

CURVE = load_curve(str(REPO / "tpu_jobs" / "rehearsal" / "curve.csv"))


@pytest.fixture(params=[NEWEST_JOBSET, OLDEST_JOBSET])
def plane(planes: Any, request: pytest.FixtureRequest) -> ControlPlane:
    """The control plane with eight single-host pools, per JobSet version: the submission's
    test asks for the newest, the run's for the oldest (`pytest.mark.parametrize`)."""
    plane: ControlPlane = planes(request.param, pools=POOLS)
    return plane


@pytest.fixture
def kwok_namespace(plane: ControlPlane) -> Iterator[str]:
    with fresh_namespace(plane) as name:
        yield name


@contextlib.contextmanager
def _rehearsal_airflow(
    plane: ControlPlane, namespace: str, tmp_path: Path
) -> Iterator[tuple[PodRunner, LocalAirflow]]:
    """The rehearsal deployment on the GKE backend in `namespace` (run folders under
    ``tmp_path/runs``) under a real Airflow, its pods run here; on a clean exit nothing of the
    runs is left on the cluster: every JobSet torn down, with its Jobs and pods."""
    deployment = tmp_path / "deployment.toml"
    deployment.write_text(gke_rehearsal_deployment(tmp_path / "runs", namespace))
    env = airflow_env(plane, namespace, deployment)
    runner = PodRunner(plane, namespace, workdir=REPO, log_dir=tmp_path / "pods")
    airflow = LocalAirflow(repo_config(tmp_path / "airflow", parallelism=4, env=env))
    with runner, airflow:
        yield runner, airflow
        wait_namespace_empty(plane, namespace)
    assert runner.errors == []


def _assert_run_stopped_at_the_curves_pass(run_dir: Path, seed: int) -> None:
    """The run's run_stop is a success at the update of the step where the rehearsal curve
    first passes, and its compliance checker passed."""
    layout = RunLayout(str(run_dir))
    rows = load(layout.manifest).rows
    passing = CURVE.first_pass(seed, 18, CONF["max_steps"])
    assert passing is not None
    (stop,) = [e for e in read_events(layout.mllog(seed)) if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    assert stop.time_ms == next(r.timestamp_ms for r in rows if r.step == passing)
    verdict = read_verdict(str(run_dir), "compliance_checker")
    assert verdict is not None and verdict.ok, verdict


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("plane", [NEWEST_JOBSET], indirect=True)
def test_the_rehearsal_submission_passes_every_checker_on_the_control_plane(
    plane: ControlPlane, kwok_namespace: str, tmp_path: Path
) -> None:
    conf = rehearsal_conf(tmp_path / "runs", "kwok")
    with _rehearsal_airflow(plane, kwok_namespace, tmp_path) as (runner, airflow):
        for dag_id in (RUN_DAG_ID, SUBMISSION_DAG_ID):
            airflow.wait_for_dag(dag_id)
        run_id = airflow.trigger(SUBMISSION_DAG_ID, conf)
        state = airflow.wait_for_run(SUBMISSION_DAG_ID, run_id, timeout_s=1200)
        report = airflow.failure_report(SUBMISSION_DAG_ID, run_id)
        runs = {seed: airflow.dag_run(RUN_DAG_ID, f"kwok__seed_{seed}")["state"] for seed in SEEDS}

    assert state == "success", report
    assert runs == {seed: "success" for seed in SEEDS}
    out = tmp_path / "runs" / "kwok"
    for seed in SEEDS:
        _assert_run_stopped_at_the_curves_pass(out / "runs" / f"seed_{seed}", seed)
    # One training pod per seed and one pod per evaluated step ran here; each ended with the
    # job's own exit code: 0, or 143 for a higher step's evaluation deleted at a pass.
    trainings = [code for pod, code in runner.exits if "-train-" in pod]
    assert trainings == [0, 0, 0], runner.exits
    assert {code for _, code in runner.exits} <= {0, 143}, runner.exits
    for tool in ("rcp_checker", "package_checker", "result_summarizer"):
        verdict = read_verdict(str(out), tool)
        assert verdict is not None and verdict.ok, verdict
    assert "**Verdict: PASS**" in (out / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("plane", [OLDEST_JOBSET], indirect=True)
def test_a_rehearsal_run_passes_its_checker_on_the_oldest_jobset(
    plane: ControlPlane, kwok_namespace: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "seed_1"
    conf = {**CONF, "seed": 1, "run_dir": str(run_dir), "division": "open"}
    with _rehearsal_airflow(plane, kwok_namespace, tmp_path) as (runner, airflow):
        airflow.wait_for_dag(RUN_DAG_ID)
        run_id = airflow.trigger(RUN_DAG_ID, conf)
        state = airflow.wait_for_run(RUN_DAG_ID, run_id, timeout_s=600)
        report = airflow.failure_report(RUN_DAG_ID, run_id)

    assert state == "success", report
    _assert_run_stopped_at_the_curves_pass(run_dir, 1)
    trainings = [code for pod, code in runner.exits if "-train-" in pod]
    assert trainings == [0], runner.exits
    # evaluations ran as JobSets too, and a higher step's was deleted at the pass or ended 0
    assert len(runner.exits) > 1 and {code for _, code in runner.exits} <= {0, 143}
