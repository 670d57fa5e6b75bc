"""The toy trainer on two slurmd nodes of the private Slurm, through the run-job operator on
the Slurm driver: one `jax.distributed` system of two processes (one per node, srun), each
saving its own shards of every checkpoint; process 0 alone writes the manifest."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from repo_paths import REPO
from slurm_driver import context, drive

from devtools.servers.slurm_cluster import SlurmCluster
from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from tasks.backend_api.job_operator import RunJobOperator
from tasks.backends.slurm.driver import SlurmDriver
from tasks.backends.slurm.settings import SlurmJobShape, SlurmSettings
from tasks.jobs.command import TRAIN_JOB
from tasks.jobs.values import train_values


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_node_training_saves_each_process_shards(
    slurm_env: SlurmCluster, jobs_dir: Path
) -> None:
    run_dir = jobs_dir / "run"
    settings = SlurmSettings(
        working_dir=str(REPO),  # python -m tpu_jobs.train imports this tree
        log_dir=str(jobs_dir / "logs"),
        python=sys.executable,
        poll_interval_s=1.0,
        train=SlurmJobShape(nodes=2, time_limit="10", signal_grace_s=60),
    )
    run = {
        "run_dir": str(run_dir),
        "seed": 1,
        "global_batch_size": 256,
        "max_steps": 3,
        "val_start_at": 2,
        "division": "open",
    }
    argv = TRAIN_JOB.render(train_values(run, sys.executable))
    env = {"JAX_PLATFORMS": "cpu", "PATH": os.environ["PATH"]}
    task = RunJobOperator(
        task_id="run", driver=SlurmDriver(settings), role="train", label="train", argv=argv,
        env=env,
    )  # fmt: skip
    driven = drive(task, context("two-nodes"), timeout_s=360)
    assert driven.result["outcome"] == "succeeded", driven.events
    rows = load(RunLayout(str(run_dir)).manifest).rows
    assert [r.step for r in rows] == [2, 3]
    for row in rows:
        files = set(os.listdir(Path(row.checkpoint_path) / "params"))
        assert {"ocdbt.process_0", "ocdbt.process_1"} <= files, files
    output = next((jobs_dir / "logs").glob("*.out")).read_text()
    assert "on n[1-2]" in output, output[-3000:]
