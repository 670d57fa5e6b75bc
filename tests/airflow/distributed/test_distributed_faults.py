"""The faults of `fault_scenarios` on the Slurm path, on the shared cluster (conftest.py), each
against the undisturbed submission's seed 1: after the faults the run's verdict, its MLLOG's
eval events and run_stop and its manifest's steps equal the undisturbed run's
(`fault_scenarios.deterministic_record`: what carries no clock), and Slurm knows exactly one
job per job name of the run, none left running. Each leaves the cluster whole for the next (the
session shares it).

The hook point is the hook `sbatch` (conftest.SBATCH_HOOK): it holds the training task in its
worker right after Slurm accepted the job, before Airflow recorded it, and holds the job
pending (`scontrol hold`). Without the hold a training that ends before the worker-kill's retry
looks would be submitted again: the adapter adopts only a job that has not ended
(docs/deploy.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from distributed_cluster import Cluster, Submission, run_jobs
from fault_scenarios import (
    EVALUATE,
    SEED,
    FaultTarget,
    scheduler_killed_and_broker_restarted,
    worker_killed_then_triggerer_lost,
)

from devtools.servers.slurm_cluster import SlurmCluster
from tasks.names import RUN_DAG_ID

# Slurm's states of a job that ended (a higher step's evaluation is cancelled after a pass).
ENDED = ("COMPLETED", "CANCELLED")
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(45 * 60)]


@dataclass(frozen=True)
class SlurmFaults(FaultTarget):
    """The Slurm path's side of `fault_scenarios.FaultTarget`."""

    slurm: SlurmCluster

    @classmethod
    def of(cls, cluster: Cluster, submission: Submission) -> SlurmFaults:
        assert submission.state == "success"
        return cls(
            cluster.airflow,
            cluster.hooks,
            submission.runs[SEED],
            str(submission.run_dir(SEED)),
            str(cluster.storage / "faults"),
            cluster.slurm,
        )

    def let_job_run(self, run_id: str, job: str) -> None:
        self.slurm.client("scontrol", "release", job)

    def training_ended(self, run_id: str) -> bool:
        found = run_jobs(self.slurm, RUN_DAG_ID, run_id).get("train", [])
        assert len(found) <= 1, found
        if not found or found[0][1] in ACTIVE:
            return False
        assert found[0][1] == "COMPLETED", found
        return True

    def assert_undisturbed(self, run_id: str, conf: dict[str, Any], state: str) -> str:
        airflow = self.airflow
        tis = airflow.task_instances(RUN_DAG_ID, run_id)
        assert state == "success", airflow.failure_report(RUN_DAG_ID, run_id)
        jobs = run_jobs(self.slurm, RUN_DAG_ID, run_id)
        assert "train" in jobs, jobs
        for label, found in jobs.items():
            assert len(found) == 1 and found[0][1] in ENDED, (label, found)
        for t in tis:
            if t["task_id"] == EVALUATE and t["state"] == "success":
                step = int(t["rendered_map_index"].removeprefix("step "))
                assert [s for _, s in jobs[f"eval-{step}"]] == ["COMPLETED"], (step, jobs)
        self.assert_same_record(conf)
        ((job, state),) = jobs["train"]
        assert state == "COMPLETED", jobs["train"]
        return job


def test_a_worker_killed_while_its_task_submits_then_the_triggerer_lost_during_the_waits(
    cluster: Cluster, submission: Submission
) -> None:
    worker_killed_then_triggerer_lost(SlurmFaults.of(cluster, submission), "worker_triggerer")


def test_a_scheduler_killed_and_the_broker_restarted_while_a_task_runs(
    cluster: Cluster, submission: Submission
) -> None:
    scheduler_killed_and_broker_restarted(SlurmFaults.of(cluster, submission), "scheduler_broker")
