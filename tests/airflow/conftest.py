"""Fixtures for the Airflow tests; the environment itself is set by airflow_harness on import."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from airflow_harness import DAGS, HOME, REPO, Recording, alive, recording_python

from devtools.servers.airflow_server import LocalAirflow, ServerConfig
from tasks.jobs.processes import free_port
from tasks.names import RUN_DAG_ID


@pytest.fixture(scope="session")
def airflow_db() -> str:
    """A fresh metadata DB for this session (created once: it takes a few seconds)."""
    from airflow.utils import db

    db.resetdb()
    return HOME


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """The test's run folder, ``tmp_path/run`` (not created: the run DAG makes it)."""
    return tmp_path / "run"


@pytest.fixture
def recording(tmp_path: Path) -> Recording:
    """The jobs' interpreter for this test, recording each job's arguments
    (`recording_python` in tmp_path)."""
    return recording_python(tmp_path)


@pytest.fixture(scope="session")
def dagbag(airflow_db: str):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(str(DAGS))


@contextlib.contextmanager
def _local_airflow(
    home: Path,
    env: Mapping[str, str],
    *,
    parallelism: int = 3,
    dag_ids: Sequence[str] = (RUN_DAG_ID,),
) -> Iterator[LocalAirflow]:
    config = ServerConfig(
        home=home,
        dags_folder=DAGS,
        plugins_folder=REPO / "plugins",
        port=free_port(),
        parallelism=parallelism,
        # this checkout's rcpflow and tasks, not what the shared venv's editable install names
        env={"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), **env},
    )
    server = LocalAirflow(config)
    try:
        server.start()
        for dag_id in dag_ids:
            server.wait_for_dag(dag_id)
        yield server
    finally:
        pids = [p.pid for p in server.processes.values()]
        server.stop()
    assert pids and not any(alive(pid) for pid in pids), "an Airflow component outlived stop()"


@pytest.fixture(scope="session")
def start_airflow() -> Callable[..., contextlib.AbstractContextManager[LocalAirflow]]:
    """``with start_airflow(home, env, parallelism=, dag_ids=) as server:`` a real Airflow
    (api-server, scheduler, dag-processor, triggerer) on 127.0.0.1 with the repository's DAGs
    and plugins and `env` (e.g. RCPFLOW_DEPLOYMENT), once `dag_ids` are parsed; on exit stopped
    by PID and checked to be gone. For the module-scoped ``server`` fixture of each scheduler
    test (each brings its own deployment)."""
    return _local_airflow
