"""What the fixtures of this folder (conftest.py) hand a test, how each test of this folder
starts its distributed Airflow (`distributed_airflow`, `running`), and what the tests ask of a
submission's checkers and of Slurm."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from airflow_harness import DAGS, PLUGINS, REPO, alive

from devtools.servers import distributed_airflow as harness
from devtools.servers.airflow_server import ServerConfig
from devtools.servers.distributed_airflow import (
    WORKERS,
    DistributedAirflow,
    DistributedConfig,
    WorkerSpec,
)
from devtools.servers.slurm_cluster import SlurmCluster
from tasks.backends.slurm.adapter import job_name
from tasks.jobs.processes import free_port
from tasks.names import COMPLIANCE_TOOL, RUN_DAG_ID, SUBMISSION_DAG_ID
from tasks.results.verdicts import read_verdict

if TYPE_CHECKING:
    from devtools.servers.container_images import Docker

CLUSTER_QUEUE = "slurm-login"
SUBMISSION_TOOLS = ("rcp_checker", "package_checker", "result_summarizer")
EVALUATE = "evaluation.checkpoint.evaluate"
# The Airflow settings of every distributed Airflow here:
SETTINGS = {
    # a lost worker's task is failed (and retried) a minute after its last heartbeat
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
    # and its retry is queued at once, not after Airflow's default 5 minutes
    "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "5",
}


def unavailable(missing: list[str], what: str) -> None:
    """Skip, naming what is missing; fail under CI, where `make test` installed it all."""
    if missing:
        message = f"{what}: not available here: {', '.join(missing)} (make system-packages)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def build_airflow(
    home: Path,
    env: Mapping[str, str],
    shared: Sequence[Path],
    workers: tuple[WorkerSpec, ...] = WORKERS,
    docker: Docker | None = None,
) -> DistributedAirflow:
    """A distributed Airflow (not started) on this checkout's DAGs and plugins, `env` on top of
    what every one here has; its workers share `shared` with the rest (a deployment file's
    folder, a local storage root, a cluster's files); `docker` runs its image workers."""
    config = ServerConfig(
        home=home,
        dags_folder=DAGS,
        plugins_folder=PLUGINS,
        port=free_port(),
        parallelism=8,
        env={
            "JAX_PLATFORMS": "cpu",
            # this checkout's rcpflow and tasks, not what the shared venv's install names
            "PYTHONPATH": str(REPO),
            **env,
        },
    )
    return DistributedAirflow(DistributedConfig(config, tuple(shared), workers, SETTINGS), docker)


@contextlib.contextmanager
def running(airflow: DistributedAirflow) -> Iterator[DistributedAirflow]:
    """`airflow` started, with the run and submission DAGs ready; stopped afterwards, every
    component of it gone."""
    unavailable(harness.missing(), "a distributed Airflow")
    try:
        airflow.start()
        airflow.ready(SUBMISSION_DAG_ID, RUN_DAG_ID)
        yield airflow
    finally:
        pids = [p.pid for p in airflow.processes.values()]
        airflow.stop()
    assert pids and not any(alive(pid) for pid in pids), "a component outlived stop()"


@dataclass(frozen=True)
class Cluster:
    airflow: DistributedAirflow
    slurm: SlurmCluster
    storage: Path  # the deployment's storage_root, shared by every component
    hooks: Path  # the sbatch hook's folder (conftest.SBATCH_HOOK)


@dataclass(frozen=True)
class Submission:
    run_id: str
    state: str
    out_dir: Path
    runs: dict[int, str]  # seed -> run id of its mlperf_grpo_run

    def run_dir(self, seed: int) -> Path:
        return self.out_dir / "runs" / f"seed_{seed}"


def assert_every_checker_passed(out_dir: str | Path, run_dirs: Sequence[str | Path]) -> None:
    """The submission's checkers (RCP, package, result summarizer) and each run's compliance
    checker wrote a verdict, and each says ok."""
    for tool in SUBMISSION_TOOLS:
        verdict = read_verdict(str(out_dir), tool)
        assert verdict is not None and verdict.ok, (tool, verdict)
    for run_dir in run_dirs:
        verdict = read_verdict(str(run_dir), COMPLIANCE_TOOL)
        assert verdict is not None and verdict.ok, (run_dir, verdict)


def assert_evaluations_on_every_worker(
    airflow: DistributedAirflow, run_tis: Sequence[Mapping[str, Any]]
) -> None:
    """The mapped evaluations among `run_tis` (task instances of runs) that succeeded were
    spread over every worker, each known by its own hostname."""
    evaluations = [t for t in run_tis if t["task_id"] == EVALUATE and t["state"] == "success"]
    assert {t["hostname"] for t in evaluations} == {w.host for w in airflow.workers.values()}, [
        (t["dag_run_id"], t["map_index"], t["hostname"]) for t in evaluations
    ]


def run_jobs(slurm: SlurmCluster, dag_id: str, run_id: str) -> dict[str, list[tuple[str, str]]]:
    """label (``train``, ``eval-12``) -> (job id, state) of every job of one DAG run that
    Slurm knows (finished ones included), told by the run's part of `job_name`."""
    head, _, tail = job_name(dag_id, run_id, "\0").partition("\0")
    found: dict[str, list[tuple[str, str]]] = {}
    for line in slurm.client("squeue", "-h", "--states=all", "-o", "%j|%i|%T").splitlines():
        name, job_id, state = (part.strip() for part in line.split("|"))
        if name.startswith(head) and name.endswith(tail):
            found.setdefault(name[len(head) : -len(tail)], []).append((job_id, state))
    return found
