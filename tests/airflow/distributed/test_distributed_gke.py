"""The GKE backend's whole 3-seed submission on the distributed Airflow: the rehearsal deployment
of the real-control-plane test (``tests/tasks/backends/gke/real/test_real_submission.py``,
its helpers in ``k8s_real.py``) under the CeleryExecutor (`distributed_cluster.build_airflow`:
two schedulers, two Celery workers each in a mount and PID namespace of its own), every job a
JobSet the real JobSet controller runs on kwok's TPU v5p nodes, each pod's container run here
by `devtools.k8s.kwok_pods.PodRunner`.

What the workers share is what a GKE deployment's workers share: the run folders on ``gs://``
(the GCS emulator, fake-gcs-server, reached through ``STORAGE_EMULATOR_HOST`` by every
component and every pod), the database, the broker, and the cluster through a Kubernetes
connection whose kubeconfig is held inline in the connection (its CA inlined too): no file of
the control plane's folder is visible to a worker. Only the deployment file's folder is bound
into the workers' private /tmp.

The control plane is the session's (`k8s_planes.planes`: this module runs in the
real-control-plane tests' xdist group, tests/conftest.py), skipped with its named reason where
its binaries are missing."""

from __future__ import annotations

import base64
import collections
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from distributed_cluster import (
    assert_evaluations_on_every_worker,
    assert_every_checker_passed,
    build_airflow,
    running,
)
from k8s_planes import Planes
from k8s_real import (
    CONN_ID,
    POOLS,
    SEEDS,
    connection_kubeconfig,
    fresh_namespace,
    gke_rehearsal_deployment,
    rehearsal_conf,
    wait_namespace_empty,
)
from repo_paths import REPO

from devtools.k8s.binaries import NEWEST_JOBSET
from devtools.k8s.kwok_pods import PodRunner
from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from tasks.names import RUN_DAG_ID, SUBMISSION_DAG_ID

NAME = "kwok-celery"
TIMEOUT_S = 1500


def inline_kubeconfig(path: Path) -> dict[str, Any]:
    """The kubeconfig at `path` with its CA certificate inlined (``certificate-authority-data``):
    a connection that names no file, as a deployment's workers on other hosts need."""
    config: dict[str, Any] = json.loads(path.read_text())  # the harness writes JSON
    for entry in config["clusters"]:
        cluster = entry["cluster"]
        ca = Path(cluster.pop("certificate-authority")).read_bytes()
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    return config


@pytest.mark.slow
@pytest.mark.timeout(40 * 60)
def test_a_three_seed_gke_submission_under_celery_on_gcs_passes_every_checker(
    planes: Planes, gcs: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plane = planes(NEWEST_JOBSET, pools=POOLS)
    storage = f"gs://{gcs.bucket}/distributed-gke-{uuid.uuid4().hex[:8]}"
    shared = tmp_path_factory.mktemp("gke-deployment")
    with fresh_namespace(plane) as namespace:
        deployment = shared / "deployment.toml"
        deployment.write_text(gke_rehearsal_deployment(storage, namespace))
        kubeconfig = inline_kubeconfig(connection_kubeconfig(plane, namespace))
        conn = {"conn_type": "kubernetes", "extra": {"kube_config": kubeconfig}}
        env = {
            "RCPFLOW_DEPLOYMENT": str(deployment),
            f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(conn),
            **gcs.env,
        }
        pods = tmp_path_factory.mktemp("gke-pods")
        runner = PodRunner(plane, namespace, workdir=REPO, log_dir=pods, env=gcs.env)
        airflow = build_airflow(tmp_path_factory.mktemp("gke-airflow"), env, (shared,))
        with runner, running(airflow):
            run_id = airflow.trigger(SUBMISSION_DAG_ID, rehearsal_conf(storage, NAME))
            state = airflow.wait_for_run(SUBMISSION_DAG_ID, run_id, TIMEOUT_S)
            runs = {seed: f"{NAME}__seed_{seed}" for seed in SEEDS}
            run_states = {seed: airflow.dag_run(RUN_DAG_ID, r)["state"] for seed, r in runs.items()}
            run_tis = [t for r in runs.values() for t in airflow.task_instances(RUN_DAG_ID, r)]
            report = "\n".join(
                [airflow.failure_report(SUBMISSION_DAG_ID, run_id)]
                + [airflow.failure_report(RUN_DAG_ID, r) for r in runs.values()]
            )
            # Nothing of the runs is left on the cluster: every JobSet torn down, with its Jobs
            # and pods, and no pod's process still running here.
            wait_namespace_empty(plane, namespace)
            assert runner.running() == []

    assert runner.errors == []
    assert state == "success", report
    assert run_states == {seed: "success" for seed in SEEDS}
    out = f"{storage}/{NAME}"
    run_dirs = [f"{out}/runs/seed_{seed}" for seed in SEEDS]
    assert_every_checker_passed(out, run_dirs)
    for run_dir in run_dirs:  # the manifest the workers' tasks read lies on gs:// too
        assert load(RunLayout(run_dir).manifest).rows, run_dir
    assert_evaluations_on_every_worker(airflow, run_tis)
    # Exactly one JobSet per job name: a JobSet is named for its DAG run and job, and each ran
    # one pod (single-host slices, no restart); a JobSet submitted twice under one name, or a
    # restarted one, would show a second pod of that name. The trainings ended 0; an
    # evaluation 0, or 143 when a higher step's evaluation was deleted at a pass.
    jobsets = collections.Counter(pod.rsplit("-", 3)[0] for pod, _ in runner.exits)
    assert jobsets and set(jobsets.values()) == {1}, runner.exits
    trainings = [code for pod, code in runner.exits if "-train-" in pod]
    assert trainings == [0] * len(SEEDS), runner.exits
    assert {code for _, code in runner.exits} <= {0, 143}, runner.exits
