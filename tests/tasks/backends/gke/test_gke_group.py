"""The GKE driver's job nodes in real Airflow: their shape (`tasks.run.job_nodes.JobNodes` on a
GKE deployment: the run task, its teardown, the queue of the cluster's tasks), and `dag.test()`
runs of the run task and its teardown where the JobSet succeeds, fails, and outlives an API
outage (run deferred, the watch trigger polled in line, cleanup as teardown), against the
stand-in Kubernetes API. Also: importing the backends and plugins stays cheap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from repo_paths import REPO

PYTHON = sys.executable
GKE_DEPLOYMENT = """
backend = "gke"
cluster_queue = "tpu-cluster"
[gke]
image = "i:1"
kubernetes_conn_id = "rcp_k8s"
"""


def _python(
    code: str, env: dict[str, str] | None, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """`code` run by a fresh interpreter in the repository root (`env`: its whole environment,
    None for ours)."""
    return subprocess.run(
        [PYTHON, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def test_the_job_nodes_on_gke_run_then_cleanup_as_teardown(tmp_path: Path) -> None:
    from airflow.sdk import DAG, task

    from tasks.backend_api.job_operator import RunJobOperator
    from tasks.backend_api.teardown import CancelRecordedJobs
    from tasks.backends.gke.driver import GkeDriver
    from tasks.deployment import parse_deployment
    from tasks.run.evaluate_operator import EvaluateOperator
    from tasks.run.job_nodes import nodes_for

    deployment = parse_deployment(GKE_DEPLOYMENT, source="d.toml", base_dir=tmp_path)
    nodes = nodes_for(deployment)
    assert isinstance(nodes.driver, GkeDriver)
    with DAG("shape", schedule=None) as dag:

        @task(multiple_outputs=True)
        def plan_run() -> dict[str, str]:
            return {"run_dir": "gs://b/r"}

        @task
        def after() -> None:
            pass

        @task
        def rows() -> list[dict[str, int]]:
            return [{"step": 18}]

        spec = plan_run()
        nodes.train_job(spec) >> after()
        nodes.evaluate(spec["run_dir"], rows())

    tasks = {t.task_id: t for t in dag.tasks}
    run, cleanup = tasks["job.run"], tasks["job.cleanup"]
    assert isinstance(run, RunJobOperator) and isinstance(cleanup, CancelRecordedJobs)
    assert run.upstream_task_ids == {"train_command", "plan_run"}
    assert cleanup.is_teardown and cleanup.upstream_task_ids == {"job.run"}
    assert (cleanup.run_task_id, cleanup.mapped) == ("job.run", False)
    # Downstream of the group waits for the work, not for the teardown.
    assert tasks["after"].upstream_task_ids == {"job.run"}
    # a task error is retried (a retry adopts the JobSet); the JobSet's restarts are its own
    assert run.retries == nodes.driver.run_retries == 2
    assert run.driver is cleanup.driver is nodes.driver
    evaluate, eval_cleanup = tasks["evaluate"], tasks["cleanup"]
    assert eval_cleanup.is_teardown and eval_cleanup.upstream_task_ids == {"evaluate"}
    assert eval_cleanup.mapped is True  # every instance's JobSet
    assert evaluate.operator_class is EvaluateOperator  # type: ignore[attr-defined]
    # every task that talks to the cluster goes to its queue
    assert {run.queue, cleanup.queue, eval_cleanup.queue} == {"tpu-cluster"}


DAG_FILE = '''
"""Test DAGs: a command rendered at run time, its JobSet run by the run task and its teardown
as the job nodes build them (`tasks.run.job_nodes`)."""
from airflow.sdk import TaskGroup, dag, task

from tasks.backend_api.job_operator import RunJobOperator
from tasks.backend_api.teardown import CancelRecordedJobs, with_cleanup
from tasks.backends.gke.driver import GkeDriver
from tasks.backends.gke.settings import GkeSettings

# A watch with a 0.3 s error budget, so that a test outage outlasts it many times.
SETTINGS = GkeSettings(
    use_dns_endpoint=True, poll_interval_s=0.05, outage_budget_s=0.3, ttl_after_finished_s=600
)


def build(dag_id, retries=0):
    @dag(dag_id=dag_id, schedule=None)
    def jobset_dag():
        @task
        def render() -> list:
            return ["python", "-m", "tpu_jobs.evaluate", "--step", "1"]

        @task
        def after() -> str:
            return "after ran"

        driver, command = GkeDriver(SETTINGS), render()
        with TaskGroup(group_id="eval_job") as group:
            run = RunJobOperator(
                task_id="run", driver=driver, role="evaluate", label="eval-1", argv=command,
                env={"XLA_FLAGS": "env-value-in-the-pod-only"}, retries=retries,
            )
            with_cleanup(run, CancelRecordedJobs(driver=driver, run_task_id=run.task_id))
        group >> after()

    return jobset_dag()


gke_ok = build("gke_ok")
gke_fail = build("gke_fail", retries=1)
gke_outage = build("gke_outage", retries=1)
'''

RUNNER = """
import json, os, sys
from airflow.providers.google.cloud.operators.kubernetes_engine import GKEClusterAuthDetails
from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
import google.auth.credentials


class FixedToken(google.auth.credentials.Credentials):
    def refresh(self, request):
        self.token = "test-token"


URL = os.environ["FAKE_KUBE_URL"]
GKEClusterAuthDetails.fetch_cluster_info = lambda self: (URL, "")
GoogleBaseHook.get_credentials_and_project_id = lambda self: (FixedToken(), "test-project")

from airflow.utils import db
from airflow.dag_processing.dagbag import DagBag
from airflow.utils.session import create_session

db.resetdb()
bag = DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
assert not bag.import_errors, bag.import_errors
results = {}
for dag_id in ("gke_ok", "gke_fail", "gke_outage"):
    dr = bag.dags[dag_id].test()
    with create_session() as session:
        tis = dr.get_task_instances(session=session)
        states = {ti.task_id: str(ti.state) for ti in tis}
        tries = {ti.task_id: ti.try_number for ti in tis}
    results[dag_id] = {
        "state": str(dr.state), "tasks": states, "tries": tries, "run_id": dr.run_id
    }
print("RESULT " + json.dumps(results))
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_dag_test_runs_the_group_to_success_and_to_failure(
    tmp_path: Path, fake_kube_api, recorded_status
) -> None:
    import threading
    import time

    from tasks.backends.gke.render import jobset_name

    running = recorded_status("status_running.json")["status"]
    succeeded = recorded_status("status_succeeded.json")["status"]
    fake_kube_api.scripts = {
        "gke-ok-": [None, running, succeeded],
        "gke-fail-": [running, recorded_status("status_failed_max_restarts.json")["status"]],
        "gke-outa": [None, running, succeeded],  # names keep 8 characters of the DAG id
    }
    # gke_outage: from the watch's first read, the API answers 503 for 3 s, ten times the
    # watch's error budget; the watch defers again each budget and follows it to success.
    outage: dict[str, float] = {}
    lock = threading.Lock()

    def failure(path: str) -> int | None:
        if "/jobsets/gke-outa" not in path:
            return None
        with lock:
            reads = outage.setdefault("reads", 0) + 1
            outage["reads"] = reads
            if reads == 2:  # the first read of the watch (the first is the create's read-back)
                outage["start"] = time.monotonic()
            start = outage.get("start")
        return 503 if start is not None and time.monotonic() - start < 3.0 else None

    fake_kube_api.get_failure = failure
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "gke_test_dags.py").write_text(textwrap.dedent(DAG_FILE))
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(tmp_path / "no-plugins"),
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps({"conn_type": "google_cloud_platform"}),
        "FAKE_KUBE_URL": fake_kube_api.url,
    }
    env.pop("RCPFLOW_DEPLOYMENT", None)
    # dag.test ignores SIGTERM; subprocess.run kills (SIGKILL) on timeout
    proc = _python(RUNNER, env, timeout_s=360)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = json.loads(lines[-1][len("RESULT ") :])

    ok, fail, outage = results["gke_ok"], results["gke_fail"], results["gke_outage"]
    assert ok["state"] == "success", ok
    assert ok["tasks"] == {
        "render": "success",
        "eval_job.run": "success",
        "eval_job.cleanup": "success",
        "after": "success",
    }
    assert fail["state"] == "failed", fail
    assert fail["tasks"]["eval_job.run"] == "failed"
    assert fail["tasks"]["eval_job.cleanup"] == "success"  # the teardown ran after the failure
    assert fail["tasks"]["after"] == "upstream_failed"
    assert fail["tries"]["eval_job.run"] == 1  # a failed JobSet is not retried
    # the outage never failed the task: one try, deferred again until the API answered
    assert outage["state"] == "success", outage
    assert outage["tries"]["eval_job.run"] == 1
    assert outage["tasks"]["eval_job.cleanup"] == "success"
    assert fake_kube_api.failed_gets >= 3
    output = proc.stdout + proc.stderr
    assert output.count("running trigger in line") >= 4  # ok, fail once, the outage 2+ times
    assert "ReachedMaxRestarts" in output
    # the outage never became a watch error (a job left to a retry to adopt)
    assert "the watch goes on" in output and "unreadable status" not in output
    assert "a retry (or clearing the task) adopts it" not in output
    assert "env-value-in-the-pod-only" not in output  # only the cluster has it
    assert all("env-value-in-the-pod-only" in json.dumps(b) for b in fake_kube_api.created)

    dag_ids = ("gke_ok", "gke_fail", "gke_outage")
    names = {d: jobset_name(d, results[d]["run_id"], "eval-1") for d in dag_ids}
    assert sorted(fake_kube_api.deleted) == sorted(names.values())  # all cleaned up
    assert fake_kube_api.objects == {}
    posts = [path for method, path, _ in fake_kube_api.requests if method == "POST"]
    assert len(posts) == 3  # one create per run task


LIGHT_IMPORT_CHECK = """
import sys
import airflow.sdk  # what every DAG file pays anyway
before = set(sys.modules)
import tasks.backends.registry  # every backend, as the DAG files import them
import plugins.rcpflow_plugin
new = sorted(set(sys.modules) - before)
heavy = [m for m in new if m.split(".")[0] in ("kubernetes", "kubernetes_asyncio", "jax", "google")
         or m.startswith(("airflow.providers.google.cloud", "airflow.providers.cncf.kubernetes."))]
heavy += [m for m in ("kubernetes", "kubernetes_asyncio", "jax") if m in sys.modules]
print("HEAVY", heavy)
print("NEW", len(new))
"""


@pytest.mark.timeout(120)
def test_importing_the_backends_and_plugins_pulls_in_no_provider_or_kubernetes(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    proc = _python(LIGHT_IMPORT_CHECK, env, timeout_s=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "HEAVY []" in proc.stdout, proc.stdout


@pytest.mark.timeout(60)
def test_settings_and_rendering_import_no_airflow(tmp_path: Path) -> None:
    # what the deployment loader needs at parse time, and what renders a JobSet
    modules = "tasks.deployment, tasks.backends.gke.settings, tasks.backends.gke.render, "
    modules += "tasks.backends.gke.status"
    code = f"import sys, {modules}; print(sorted(m for m in sys.modules if 'airflow' in m))"
    proc = _python(code, None, timeout_s=50)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"
