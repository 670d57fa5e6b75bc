"""One distributed Airflow (`devtools.servers.distributed_airflow`) and one private Slurm for
every test of this folder (starting them costs about a minute): CeleryExecutor, two schedulers,
two Celery workers in namespaces of their own, the demo's Slurm deployment, the run folders
under one shared storage root."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from airflow_harness import DAGS, PLUGINS, REPO, alive
from distributed_cluster import Cluster

from devtools import demo
from devtools.servers import distributed_airflow, slurm_cluster
from devtools.servers.airflow_server import ServerConfig
from devtools.servers.distributed_airflow import DistributedAirflow, DistributedConfig
from devtools.servers.slurm_cluster import NodeSpec, SlurmCluster
from tasks.jobs.processes import free_port
from tasks.names import RUN_DAG_ID, SUBMISSION_DAG_ID


def _unavailable(missing: list[str], what: str) -> None:
    """Skip, naming what is missing; fail under CI, where `make test` installed it all."""
    if missing:
        message = f"{what}: not available here: {', '.join(missing)} (make system-packages)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    _unavailable(slurm_cluster.missing_binaries(), "a private Slurm")
    _unavailable(distributed_airflow.missing(), "a distributed Airflow")
    storage = tmp_path_factory.mktemp("storage")
    slurm = SlurmCluster(
        (NodeSpec("n1", demo.SLURM_NODE_CPUS), NodeSpec("n2", demo.SLURM_NODE_CPUS))
    )
    with slurm:
        # beside the cluster's files: the workers share them (their homes are their own)
        deployment = slurm.root / "deployment.toml"
        deployment.write_text(demo.slurm_deployment(slurm.root / "jobs", storage_root=storage))
        config = ServerConfig(
            home=tmp_path_factory.mktemp("airflow"),
            dags_folder=DAGS,
            plugins_folder=PLUGINS,
            port=free_port(),
            parallelism=8,
            env={
                "JAX_PLATFORMS": "cpu",
                # this checkout's rcpflow and tasks, not what the shared venv's install names
                "PYTHONPATH": str(REPO),
                "RCPFLOW_DEPLOYMENT": str(deployment),
                **slurm.env,
            },
        )
        airflow = DistributedAirflow(DistributedConfig(config, shared=(storage, slurm.root)))
        try:
            airflow.start()
            airflow.ready(SUBMISSION_DAG_ID, RUN_DAG_ID)
            yield Cluster(airflow, slurm, storage)
        finally:
            pids = [p.pid for p in airflow.processes.values()]
            airflow.stop()
        assert pids and not any(alive(pid) for pid in pids), "a component outlived stop()"
    slurm.cleanup()
