"""The DAG files parse without errors, cheaply (no JAX, no Kubernetes/GKE operator modules), and
so do the plugin modules; Airflow's plugin manager registers the rcpflow plugin."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from airflow_harness import AIRFLOW_ENV, DAGS, PLUGINS, PYTHON, REPO

DAG_IDS = {"mlperf_grpo_run", "mlperf_grpo_deferred_eval", "mlperf_grpo_submission"}
DAG_FILES = sorted(p.name for p in DAGS.glob("*.py"))
PLUGIN_FILES = sorted(p.name for p in PLUGINS.glob("*.py") if p.name != "__init__.py")

# Modules that cost seconds to import or belong on the accelerator, never in a DAG parse.
FORBIDDEN = (
    "jax",
    "flax",
    "optax",
    "orbax",
    "tpu_jobs",
    "kubernetes",
    "kubernetes_asyncio",
    "airflow.providers.google.cloud.operators.kubernetes_engine",
    "airflow.providers.google.cloud.hooks.kubernetes_engine",
    "airflow.providers.cncf.kubernetes.operators.pod",
    "airflow.providers.cncf.kubernetes.hooks.kubernetes",
    # the Slurm backend's cluster calls: SSH clients and the hooks module
    "paramiko",
    "asyncssh",
    "airflow.providers.ssh.hooks.ssh",
    "tasks.backends.slurm.hooks",
)

_PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("probed", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps(sorted(sys.modules)))
"""

GKE_DEPLOYMENT = """
backend = "gke"
storage_root = "gs://rcpflow-test/runs"
eval_retries = 3

[gke]
project_id = "test-project"
cluster_name = "test-cluster"
image = "example.com/rcpflow-tpu:test"
"""


SLURM_DEPLOYMENT = """
backend = "slurm"
storage_root = "/shared/rcpflow/runs"

[slurm]
transport = "ssh"
ssh_conn_id = "slurm_login"
working_dir = "/shared/rcpflow"
log_dir = "/shared/rcpflow/logs"

[slurm.train]
nodes = 2
gpus_per_node = 4
"""


def _gke_deployment(folder: Path) -> str:
    toml = folder / "deployment.toml"
    toml.write_text(GKE_DEPLOYMENT)
    return str(toml)


def _deployment_env(backend: str, folder: Path) -> dict[str, str]:
    if backend == "gke":
        return {"RCPFLOW_DEPLOYMENT": _gke_deployment(folder)}
    if backend == "slurm":
        toml = folder / "deployment.toml"
        toml.write_text(SLURM_DEPLOYMENT)
        return {"RCPFLOW_DEPLOYMENT": str(toml)}
    return {}


def test_dagbag_has_no_import_errors(dagbag) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) >= DAG_IDS


def _probe(code: str, *args: str, extra_env: dict[str, str], timeout_s: float) -> Any:
    """Run `code` in a fresh interpreter under the tests' Airflow environment; the JSON it
    printed last."""
    proc = subprocess.run(
        [PYTHON, "-c", code, *args],
        env={**os.environ, **AIRFLOW_ENV, **extra_env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in FORBIDDEN or m in FORBIDDEN]


def _modules_after_parsing(path: Path, extra_env: dict[str, str]) -> list[str]:
    return _probe(_PROBE, str(path), extra_env=extra_env, timeout_s=120)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["local", "gke", "slurm"])
@pytest.mark.parametrize("dag_file", DAG_FILES)
def test_parsing_imports_nothing_heavy(dag_file: str, backend: str, tmp_path: Path) -> None:
    extra = _deployment_env(backend, tmp_path)
    modules = _modules_after_parsing(DAGS / dag_file, extra)
    loaded = _heavy(modules)
    assert loaded == [], f"parsing {dag_file} ({backend}) imported {loaded}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("plugin_file", PLUGIN_FILES)
def test_loading_a_plugin_module_imports_nothing_heavy(plugin_file: str) -> None:
    # every Airflow component (api-server, scheduler, triggerer) imports these
    modules = _modules_after_parsing(PLUGINS / plugin_file, {})
    loaded = _heavy(modules)
    assert loaded == [], f"loading {plugin_file} imported {loaded}"
    assert [m for m in modules if m == "devtools" or m.startswith("devtools.")] == []


_PLUGINS = """
import json, sys
from airflow import plugins_manager
plugins, errors = plugins_manager._get_plugins()
print(json.dumps({
    "names": sorted(p.name for p in plugins),
    "errors": errors,
    "apps": {p.name: [a["url_prefix"] for a in p.fastapi_apps] for p in plugins},
    "views": {p.name: [v["url_route"] for v in p.external_views] for p in plugins},
    "modules": sorted(sys.modules),
}))
"""
# Loading the plugins folder happens in every task process (for macros): the RCP view's app,
# its plot and the API server's modules are for the API server's first request only.
NOT_AT_PLUGIN_LOAD = ("matplotlib", "plugins.rcp_view.app", "tasks.views.convergence", "fastapi")


@pytest.mark.timeout(300)
def test_airflow_registers_the_rcpflow_plugin_cheaply() -> None:
    found = _probe(_PLUGINS, extra_env={}, timeout_s=240)
    assert found["errors"] == {}
    assert found["names"] == ["rcpflow"]  # the folder's other modules are not plugins
    assert found["apps"]["rcpflow"] == ["/rcp"]
    assert found["views"]["rcpflow"] == ["mlperf-rcp", "mlperf-rcp-run"]
    modules = found["modules"]
    heavy = _heavy(modules)
    assert heavy == []
    late = [m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_AT_PLUGIN_LOAD)]
    assert late == [], f"loading the plugins imported {late}"


_SERIALIZE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
bag = DagBag(sys.argv[1])
assert not bag.import_errors, bag.import_errors
out = {}
for dag_id, dag in bag.dags.items():
    DagSerialization.serialize_dag(dag)  # what the dag-processor stores
    out[dag_id] = sorted(dag.task_dict)
    out[dag_id + ":retries"] = {t: dag.task_dict[t].retries for t in dag.task_dict}
    out[dag_id + ":retry_delay"] = {
        t: dag.task_dict[t].retry_delay.total_seconds() for t in dag.task_dict
    }
print(json.dumps(out))
"""


@pytest.mark.timeout(300)
def test_gke_deployment_builds_jobset_tasks(tmp_path: Path) -> None:
    extra = {"RCPFLOW_DEPLOYMENT": _gke_deployment(tmp_path)}
    tasks = _probe(_SERIALIZE, str(DAGS), extra_env=extra, timeout_s=240)
    assert {
        "train.train_command",
        "train.job.run",
        "train.job.cleanup",
        "train.check_outputs",
    } <= set(tasks["mlperf_grpo_run"])
    # the run DAG evaluates per planned step (either schedule), the deferred one per row
    for dag_id, group in (
        ("mlperf_grpo_run", "evaluation.checkpoint"),
        ("mlperf_grpo_deferred_eval", "evaluation"),
    ):
        assert {f"{group}.evaluate", f"{group}.cleanup", "evaluation.finalize"} <= set(
            tasks[dag_id]
        )
        # a retry adopts the JobSet after a lost watch: evaluation has eval_retries
        assert tasks[f"{dag_id}:retries"][f"{group}.evaluate"] == 3
    assert tasks["mlperf_grpo_run:retries"]["train.job.run"] == 2  # gke.run_retries
    # a wait only reads: a passing fault of its trigger is tried again (WAIT_RETRIES)
    assert tasks["mlperf_grpo_run:retries"]["evaluation.checkpoint.wait"] == 2


@pytest.mark.timeout(300)
def test_slurm_retries_come_within_slurms_memory_of_an_ended_job(tmp_path: Path) -> None:
    # a retry adopts the job that ended with success only while slurmctld still knows it
    # (MinJobAge, 300 s by default: Airflow's default retry delay): it comes a poll later
    tasks = _probe(_SERIALIZE, str(DAGS), extra_env=_deployment_env("slurm", tmp_path),
                   timeout_s=240)  # fmt: skip
    delays = tasks["mlperf_grpo_run:retry_delay"]
    assert delays["evaluation.checkpoint.evaluate"] == 15.0  # slurm.poll_interval_s
    assert delays["train.job.run"] == 15.0
    assert tasks["mlperf_grpo_deferred_eval:retry_delay"]["evaluation.evaluate"] == 15.0
