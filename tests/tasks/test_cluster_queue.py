"""`cluster_queue` (tasks.deployment): every operator that talks to a cluster goes to the
deployment's queue, every other task to Airflow's default one; a bad name is refused naming the
key. That a worker listening on the queue runs them: tests/airflow/distributed/."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools import demo
from tasks.deployment import Deployment, parse_deployment
from tasks.run.job_nodes import nodes_for
from tasks.settings import SettingError


def _slurm(tmp_path: Path, head: str) -> Deployment:
    text = head + demo.slurm_deployment(tmp_path / "logs", storage_root=tmp_path)
    return parse_deployment(text, source="d.toml", base_dir=tmp_path)


def _queues(deployment: Deployment) -> dict[str, str]:
    from airflow.sdk import DAG, TaskGroup, task

    nodes = nodes_for(deployment)
    with DAG("queues", schedule=None) as dag:

        @task
        def spec() -> dict[str, object]:
            return {}

        @task
        def rows() -> list[dict[str, object]]:
            return []

        nodes.train_job(spec())
        nodes.evaluate("/runs/x", rows())
        with TaskGroup("checkpoint"):  # as the run DAG nests it (one task id each)
            nodes.evaluate_checkpoint("/runs/x", 18)
    return {t.task_id: t.queue for t in dag.tasks}


def test_cluster_tasks_go_to_the_deployments_queue(tmp_path: Path) -> None:
    queues = _queues(_slurm(tmp_path, 'cluster_queue = "slurm-login"\n'))
    # the operators that submit, watch or cancel Slurm jobs; the rest only compute
    cluster = {t for t, q in queues.items() if q == "slurm-login"}
    assert cluster == {"job.run", "job.cleanup", "evaluate", "checkpoint.evaluate"} | {
        t for t in queues if t.endswith("cleanup")
    }, queues
    assert {q for t, q in queues.items() if t not in cluster} == {"default"}, queues


def test_without_a_cluster_queue_every_task_takes_the_default_queue(tmp_path: Path) -> None:
    assert set(_queues(_slurm(tmp_path, "")).values()) == {"default"}


@pytest.mark.parametrize("name", ["a,b", "", " x", "x" * 65])
def test_a_bad_queue_name_is_refused_naming_the_key(tmp_path: Path, name: str) -> None:
    if not name:
        assert _slurm(tmp_path, 'cluster_queue = ""\n').cluster_queue == ""
        return
    with pytest.raises((SettingError, ValueError), match="cluster_queue"):
        _slurm(tmp_path, f"cluster_queue = {name!r}\n")
