"""The whole 3-seed submission of `make demo BACKEND=slurm` on the distributed Airflow
(conftest.py): every task ran on one of the two Celery workers, each with its own /tmp, home and
logs folder, so nothing a task left on its host's disk could reach another task, and nothing the
API shows of a task's log came from a folder the API server shares with it; the tasks that talk
to Slurm went to the deployment's `cluster_queue`, which the second worker alone listens on."""

from __future__ import annotations

from pathlib import Path

import pytest
from distributed_cluster import (
    CLUSTER_QUEUE,
    EVALUATE,
    Cluster,
    Submission,
    assert_evaluations_on_every_worker,
    assert_every_checker_passed,
)

from tasks.names import RUN_DAG_ID, SUBMISSION_DAG_ID


@pytest.mark.slow
@pytest.mark.timeout(45 * 60)
def test_a_three_seed_slurm_submission_under_celery_passes_every_checker(
    cluster: Cluster, submission: Submission
) -> None:
    airflow = cluster.airflow
    submission_tis = airflow.task_instances(SUBMISSION_DAG_ID, submission.run_id)
    assert submission.state == "success", "\n".join(
        [airflow.failure_report(SUBMISSION_DAG_ID, submission.run_id)]
        + [airflow.failure_report(RUN_DAG_ID, r) for r in submission.runs.values()]
    )
    assert_every_checker_passed(
        submission.out_dir, [submission.run_dir(s) for s in submission.runs]
    )
    run_tis = [
        t for run_id in submission.runs.values() for t in airflow.task_instances(RUN_DAG_ID, run_id)
    ]
    # The mapped evaluations were spread over both workers, each known by its own hostname.
    assert_evaluations_on_every_worker(airflow, run_tis)
    workers = airflow.workers
    # Routing: the Slurm-facing operators went to the cluster queue, nothing else did, and the
    # worker that listens on that queue alone ran nothing else.
    ran = [t for t in run_tis + submission_tis if t["hostname"]]
    cluster_tasks = {t["task_id"] for t in ran if t["queue"] == CLUSTER_QUEUE}
    assert {EVALUATE, "train.job.run"} <= cluster_tasks, cluster_tasks
    assert all(t.endswith(("run", "evaluate", "cleanup")) for t in cluster_tasks), cluster_tasks
    assert {t["queue"] for t in ran if t["task_id"] not in cluster_tasks} == {"default"}
    second = workers["worker-2"].host
    assert {t["queue"] for t in ran if t["hostname"] == second} == {CLUSTER_QUEUE}
    # A task's log lies in its worker's own logs folder, not the API server's (which holds
    # only what the triggerer wrote of a deferred task's): the API fetched it from that
    # worker's log server. The train command is rendered by a task that never defers.
    (render,) = [t for t in run_tis if t["task_id"].endswith("train_command")][:1]
    local = Path(airflow.config.home) / "logs" / f"dag_id={RUN_DAG_ID}"
    assert not list(local.glob(f"run_id={render['dag_run_id']}/task_id={render['task_id']}/*"))
    text = airflow.task_log(
        RUN_DAG_ID, render["dag_run_id"], render["task_id"], try_number=render["try_number"]
    )
    assert text and "Could not read served logs" not in text, text[-2000:]
