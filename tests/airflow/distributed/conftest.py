"""One distributed Airflow (`devtools.servers.distributed_airflow`) and one private Slurm for
every test of this folder (starting them costs about a minute), and the one undisturbed 3-seed
submission the fault tests compare with: CeleryExecutor, two schedulers, two Celery workers in
namespaces of their own, the demo's Slurm deployment with its cluster tasks routed to the queue
``slurm-login`` (worker-1 listens on it and the default queue, worker-2 on it alone), the run
folders under one shared storage root, and a ``sbatch`` hook on the workers' PATH
(`SBATCH_HOOK`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed_cluster import (
    CLUSTER_QUEUE,
    Cluster,
    Submission,
    build_airflow,
    running,
    unavailable,
)

from devtools import demo
from devtools.servers import distributed_airflow, slurm_cluster
from devtools.servers.distributed_airflow import WorkerSpec
from devtools.servers.slurm_cluster import NodeSpec, SlurmCluster
from tasks.names import SUBMISSION_DAG_ID

SEEDS = (1, 2, 3)
# The fault tests' hook point: sbatch as usual; when the test armed it (a file `armed` in the
# hook's folder), the job is held (pending until the test releases it in Slurm: it cannot end
# before a retry looks for it) and the task stays in sbatch, its job submitted but not yet
# recorded by Airflow, writing where it is (the worker's hostname) to `submitted`, until the
# test kills it or lets it go on (a file `release`).
SBATCH_HOOK = """#!/bin/sh
out=$({sbatch} "$@")
rc=$?
printf '%s\\n' "$out"
if [ $rc -eq 0 ] && rm "{hooks}/armed" 2>/dev/null; then
    scontrol hold "$out"
    printf '%s %s\\n' "$RCPFLOW_AIRFLOW_HOSTNAME" "$out" > "{hooks}/submitted.tmp"
    mv "{hooks}/submitted.tmp" "{hooks}/submitted"
    until rm "{hooks}/release" 2>/dev/null; do sleep 0.2; done
fi
exit $rc
"""


def _sbatch_hook(hooks: Path) -> Path:
    """A folder holding the hook `sbatch` (SBATCH_HOOK) in front of the real one."""
    real = shutil.which("sbatch")
    assert real is not None
    bin_dir = hooks / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "sbatch").write_text(SBATCH_HOOK.format(sbatch=real, hooks=hooks))
    (bin_dir / "sbatch").chmod(0o755)
    return bin_dir


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    unavailable(slurm_cluster.missing_binaries(), "a private Slurm")
    unavailable(distributed_airflow.missing(), "a distributed Airflow")
    storage = tmp_path_factory.mktemp("storage")
    hooks = tmp_path_factory.mktemp("hooks")
    bin_dir = _sbatch_hook(hooks)
    slurm = SlurmCluster(
        (NodeSpec("n1", demo.SLURM_NODE_CPUS), NodeSpec("n2", demo.SLURM_NODE_CPUS)),
        min_job_age_s=3 * 3600,  # Slurm still knows every job of the session at its end
    )
    with slurm:
        # beside the cluster's files: the workers share them (their homes are their own)
        deployment = slurm.root / "deployment.toml"
        deployment.write_text(
            f'cluster_queue = "{CLUSTER_QUEUE}"\n'
            # the sbatch hook names its worker: Slurm's commands see only what export_env names
            + demo.slurm_deployment(slurm.root / "jobs", storage_root=storage).replace(
                "[slurm]\n", '[slurm]\nexport_env = ["RCPFLOW_AIRFLOW_HOSTNAME"]\n', 1
            )
        )
        path = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        workers = (
            WorkerSpec("worker-1", "127.0.0.2", ("default", CLUSTER_QUEUE), env=path),
            WorkerSpec("worker-2", "127.0.0.3", (CLUSTER_QUEUE,), env=path),
        )
        airflow = build_airflow(
            tmp_path_factory.mktemp("airflow"),
            {"RCPFLOW_DEPLOYMENT": str(deployment), **slurm.env},
            (storage, slurm.root, hooks),
            workers,
        )
        with running(airflow):
            yield Cluster(airflow, slurm, storage, hooks)
    slurm.cleanup()


@pytest.fixture(scope="session")
def submission(cluster: Cluster) -> Submission:
    """`make demo BACKEND=slurm`'s 3-seed submission, run once, undisturbed."""
    conf = demo.demo_conf(SEEDS, 256, 40, "slurm", storage_root=cluster.storage)
    run_id = cluster.airflow.trigger(SUBMISSION_DAG_ID, conf, run_id="undisturbed")
    state = cluster.airflow.wait_for_run(SUBMISSION_DAG_ID, run_id, demo.SLURM_TIMEOUT_S)
    out_dir = cluster.storage / demo.NAME
    runs = {seed: f"{demo.NAME}__seed_{seed}" for seed in SEEDS}
    return Submission(run_id, state, out_dir, runs)
