"""jobset_task_group (tasks.backends.gke.backend) in real Airflow: its shape, and `dag.test()`
runs where the JobSet succeeds and fails (run deferred, the trigger polled in line, cleanup as
teardown), against the stand-in Kubernetes API. Also: importing the backends and plugins
stays cheap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from repo_paths import REPO

from tasks.backends.gke.settings import GkeSettings

PYTHON = sys.executable


def _python(
    code: str, env: dict[str, str] | None, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """`code` run by a fresh interpreter in the repository root (`env`: its whole environment,
    None for ours)."""
    return subprocess.run(
        [PYTHON, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def test_group_shape_run_then_cleanup_as_teardown() -> None:
    from airflow.sdk import DAG, task, task_group

    from tasks.backends.gke.backend import jobset_task_group

    with DAG("shape", schedule=None) as dag:

        @task
        def render() -> list[str]:
            return ["python"]

        @task
        def after() -> None:
            pass

        settings = GkeSettings()
        group = jobset_task_group(
            "train_job", settings, role="train", job="train", command=render()
        )
        group >> after()

        @task_group
        def evaluate(step: int) -> None:
            @task
            def render_eval(step: int) -> list[str]:
                return ["python", str(step)]

            jobset_task_group(
                "job", settings, role="evaluate", job="eval", command=render_eval(step)
            )

        evaluate.expand(step=[18, 19])

    tasks = {t.task_id: t for t in dag.tasks}
    assert tasks["train_job.run"].upstream_task_ids == {"render"}
    assert tasks["train_job.cleanup"].is_teardown
    assert tasks["train_job.cleanup"].upstream_task_ids == {"train_job.run"}
    # Downstream of the group waits for the work, not for the teardown.
    assert tasks["after"].upstream_task_ids == {"train_job.run"}
    assert tasks["evaluate.job.cleanup"].is_teardown
    assert tasks["evaluate.job.run"].upstream_task_ids == {"evaluate.render_eval"}


DAG_FILE = '''
"""Test DAGs: a command rendered at run time, its JobSet run through jobset_task_group."""
from airflow.sdk import dag, task

from tasks.backends.gke.backend import jobset_task_group
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

        group = jobset_task_group(
            "eval_job", SETTINGS, role="evaluate", job="eval-1", command=render(),
            env={"XLA_FLAGS": "env-value-in-the-pod-only"}, retries=retries,
        )
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
    assert "the watch goes on" in output and "could not follow" not in output
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
