"""The local backend is refused under a distributed executor, in one line naming the deployment
file, the backend and the executor; the cluster backends and the single-host executors pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.backends.local.driver import LocalDriver
from tasks.backends.registry import driver_for
from tasks.deployment import DeploymentError, parse_deployment
from tasks.executor_rule import executor_classes, executor_refusal


def test_executor_classes_read_every_form_of_the_setting() -> None:
    assert executor_classes("CeleryExecutor") == ["CeleryExecutor"]
    assert executor_classes(
        "LocalExecutor, airflow.providers.celery.executors.celery_executor.CeleryExecutor"
    ) == ["LocalExecutor", "CeleryExecutor"]
    assert executor_classes("gpu:my.module.GpuExecutor") == ["GpuExecutor"]


@pytest.mark.parametrize(
    "executor",
    [
        "CeleryExecutor",
        "KubernetesExecutor",
        "LocalExecutor,CeleryExecutor",
        "airflow.providers.edge3.executors.EdgeExecutor",
    ],
)
def test_the_local_backend_is_refused_under_a_distributed_executor(executor: str) -> None:
    line = executor_refusal(executor, "local", "/etc/rcpflow/deployment.toml")
    assert line is not None and "\n" not in line
    assert line.startswith("/etc/rcpflow/deployment.toml: backend: 'local' runs jobs")
    assert repr(executor) in line and "docs/deploy.md" in line


@pytest.mark.parametrize("executor", ["LocalExecutor", "SequentialExecutor", ""])
def test_the_local_backend_runs_under_a_single_host_executor(executor: str) -> None:
    assert executor_refusal(executor, "local", "f.toml") is None


def test_the_run_dags_backend_is_refused_where_it_is_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = parse_deployment('backend = "local"\n', source="d.toml", base_dir=tmp_path)
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    with pytest.raises(DeploymentError, match=r"^d\.toml: backend: 'local' runs jobs"):
        driver_for(deployment)
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    assert isinstance(driver_for(deployment), LocalDriver)
