"""Faults of a distributed deployment, on the shared cluster (conftest.py), each against the
undisturbed submission's seed 1 (same conf, its own run folder): after the fault the run's
verdict, its MLLOG's eval events and run_stop and its manifest's steps equal the undisturbed
run's (`deterministic_record`: what carries no clock), and Slurm knows exactly one job per job
name of the run, none left running.

The worker kill: the hook `sbatch` (conftest.SBATCH_HOOK) holds the training task in the worker
right after Slurm accepted the job, before Airflow recorded it, and holds the job pending; the
test SIGKILLs that worker's whole namespace there (a host lost), the scheduler fails the task
once its heartbeat stops, and its retry, on the other worker, adopts the job by its name instead
of submitting a second; then the test releases the job. (Without the hold a training that ends
before the retry looks is submitted again: the adapter adopts only a job that has not ended;
docs/deploy.md.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from distributed_cluster import Cluster, Submission, deterministic_record, slurm_jobs

from tasks.backends.slurm.operators import job_name
from tasks.names import RUN_DAG_ID

TRAIN = "train.job.run"
SEED = 1


def _wait_for(path: Path, cluster: Cluster, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        cluster.airflow.check_alive()
        assert time.monotonic() < deadline, f"{path} not written after {timeout_s}s"
        time.sleep(0.2)
    return path.read_text()


def _wait_for_retry(cluster: Cluster, run_id: str, timeout_s: float) -> dict:
    """The training task's retry once it has deferred (it started or adopted its job)."""
    deadline = time.monotonic() + timeout_s
    while True:
        tis = cluster.airflow.task_instances(RUN_DAG_ID, run_id)
        (train,) = [t for t in tis if t["task_id"] == TRAIN]
        if train["try_number"] >= 2 and train["state"] == "deferred":
            return train
        assert time.monotonic() < deadline, f"no retry deferred after {timeout_s}s: {train}"
        time.sleep(1.0)


def _rerun_of_seed(cluster: Cluster, submission: Submission, name: str) -> tuple[str, dict]:
    """The run id and conf of seed SEED's undisturbed run, in a run folder of its own."""
    conf = dict(cluster.airflow.dag_run(RUN_DAG_ID, submission.runs[SEED])["conf"])
    conf["run_dir"] = str(cluster.storage / "faults" / name)
    return f"fault__{name}", conf


@pytest.mark.slow
@pytest.mark.timeout(45 * 60)
def test_a_worker_killed_while_its_task_submits_a_slurm_job(
    cluster: Cluster, submission: Submission
) -> None:
    assert submission.state == "success"
    airflow = cluster.airflow
    run_id, conf = _rerun_of_seed(cluster, submission, "worker_kill")
    (cluster.hooks / "armed").touch()  # the next sbatch is this run's training
    airflow.trigger(RUN_DAG_ID, conf, run_id=run_id)

    host, job_id = _wait_for(cluster.hooks / "submitted", cluster, 600).split()
    (killed,) = [n for n, w in airflow.workers.items() if w.host == host]
    (train,) = [t for t in airflow.task_instances(RUN_DAG_ID, run_id) if t["task_id"] == TRAIN]
    assert train["state"] == "running" and train["hostname"] == host, train
    airflow.kill(killed)
    try:
        # the job is held (the hook): released once the retry took it over and deferred
        retry = _wait_for_retry(cluster, run_id, 600)
    finally:
        # back before the rest of the run: worker-1 alone serves the default queue
        airflow.restart(killed)
    cluster.slurm.client("scontrol", "release", job_id)
    state = airflow.wait_for_run(RUN_DAG_ID, run_id, 1800)

    tis = airflow.task_instances(RUN_DAG_ID, run_id)
    (train,) = [t for t in tis if t["task_id"] == TRAIN]
    assert state == "success", [(t["task_id"], t["map_index"], t["state"]) for t in tis]
    # retried, on the other worker (the killed one stayed down until the retry had deferred)
    assert retry["hostname"] not in ("", None, host), retry
    assert train["try_number"] == retry["try_number"], train
    # one training job, the one the killed try submitted, adopted; nothing left running
    assert slurm_jobs(cluster.slurm, job_name(RUN_DAG_ID, run_id, "train")) == [
        (job_id, "COMPLETED")
    ]
    for t in tis:
        if t["task_id"] == "evaluation.checkpoint.evaluate" and t["state"] == "success":
            step = int(t["rendered_map_index"].removeprefix("step "))
            jobs = slurm_jobs(cluster.slurm, job_name(RUN_DAG_ID, run_id, f"eval-{step}"))
            assert [s for _, s in jobs] == ["COMPLETED"], (step, jobs)
    assert deterministic_record(Path(conf["run_dir"]), SEED) == deterministic_record(
        submission.run_dir(SEED), SEED
    )
