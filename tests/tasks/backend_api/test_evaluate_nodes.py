"""The evaluate nodes every backend builds through `tasks.backend_api.evaluate_nodes`: the
backend's evaluate operator, mapped over the rows (labelled by step) or for one step, and its
cleanup teardown, which cancels what every instance (mapped) or that one instance started."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools import demo
from tasks.backend_api.evaluate_nodes import ROW_MAP_INDEX, STEP_MAP_INDEX
from tasks.backend_api.teardown import CancelRecordedJobs
from tasks.backends.registry import backend_for
from tasks.deployment import parse_deployment

DEPLOYMENTS = {
    "local": lambda tmp: f'storage_root = "{tmp}"\n',
    "slurm": lambda tmp: demo.slurm_deployment(tmp / "logs", storage_root=tmp),
    "gke": lambda tmp: f'storage_root = "{tmp}"\nbackend = "gke"\n[gke]\nimage = "i:1"\n',
}


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_each_backend_builds_both_evaluate_nodes_with_their_teardown(
    name: str, tmp_path: Path
) -> None:
    from airflow.sdk import DAG, TaskGroup, task

    deployment = parse_deployment(DEPLOYMENTS[name](tmp_path), source="d.toml", base_dir=tmp_path)
    backend = backend_for(deployment)
    assert backend.name == name
    with DAG("nodes", schedule=None) as dag:

        @task
        def rows() -> list[dict[str, object]]:
            return []

        mapped = backend.evaluate("/runs/x", rows())
        with TaskGroup("checkpoint"):
            one = backend.evaluate_checkpoint("/runs/x", 18)
    tasks = dag.task_dict
    assert mapped is tasks["evaluate"] and one is tasks["checkpoint.evaluate"]
    assert tasks["evaluate"].map_index_template == ROW_MAP_INDEX
    assert tasks["evaluate"].partial_kwargs["run_dir"] == "/runs/x"
    assert tasks["checkpoint.evaluate"].map_index_template == STEP_MAP_INDEX
    assert (tasks["checkpoint.evaluate"].run_dir, tasks["checkpoint.evaluate"].step) == (
        "/runs/x",
        18,
    )
    for node, mapped_cleanup in (("evaluate", True), ("checkpoint.evaluate", False)):
        cleanup = tasks[node.replace("evaluate", "cleanup")]
        assert isinstance(cleanup, CancelRecordedJobs) and cleanup.is_teardown
        assert cleanup.upstream_task_ids == {node}
        assert (cleanup.run_task_id, cleanup.mapped) == (node, mapped_cleanup)
