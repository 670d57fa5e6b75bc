"""Faults of a distributed deployment, on the shared cluster (conftest.py), each against the
undisturbed submission's seed 1 (same conf, its own run folder): after the fault the run's
verdict, its MLLOG's eval events and run_stop and its manifest's steps equal the undisturbed
run's (`deterministic_record`: what carries no clock), and Slurm knows exactly one job per job
name of the run, none left running (`_assert_undisturbed`). Each leaves the cluster whole for
the next (the module shares it).

The hook point of three of them is the hook `sbatch` (conftest.SBATCH_HOOK): it holds the
training task in its worker right after Slurm accepted the job, before Airflow recorded it,
and holds the job pending. There:

- the worker kill: the test SIGKILLs that worker's whole namespace (a host lost), the scheduler
  fails the task once its heartbeat stops, and its retry, on the other worker, adopts the job by
  its name instead of submitting a second; then the test releases the job. (Without the hold a
  training that ends before the retry looks is submitted again: the adapter adopts only a job
  that has not ended; docs/deploy.md.)
- the scheduler kill: the test SIGKILLs the scheduler that queued the held task (`scheduler_of`)
  and lets the task go on; the other scheduler carries the rest of the run; the killed one is
  started again at the end.
- the broker restart: with the task running and nothing queued, Redis is stopped and started
  again (empty: it keeps nothing on disk); both workers answer Celery's ping on the new one
  before the task goes on, and every later task goes through it.

The triggerer restart needs no hook: the test kills the triggerer once the training's watch and
the evaluation waits are deferred on it (the task instances' states), keeps it down until the
training's Slurm job has ended (nothing can resume without it: the training task is still
deferred then), and starts it again: the new triggerer takes the triggers over and sees the
job's end it missed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from distributed_cluster import Cluster, Submission, deterministic_record, run_jobs

from tasks.names import RUN_DAG_ID

TRAIN = "train.job.run"
WAIT = "evaluation.checkpoint.wait"
EVALUATE = "evaluation.checkpoint.evaluate"
SEED = 1
# Slurm's states of a job that ended (a higher step's evaluation is cancelled after a pass).
ENDED = ("COMPLETED", "CANCELLED")
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED")

TaskInstances = list[dict[str, Any]]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(45 * 60)]


def _wait_for(path: Path, cluster: Cluster, timeout_s: float) -> str:
    """The text of `path` once it is written; the file is taken (the next fault waits anew)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        cluster.airflow.check_alive()
        assert time.monotonic() < deadline, f"{path} not written after {timeout_s}s"
        time.sleep(0.2)
    text = path.read_text()
    path.unlink()
    return text


def _wait_for_tis(
    cluster: Cluster, run_id: str, what: str, moment: Callable[[TaskInstances], bool]
) -> TaskInstances:
    """The run's task instances once `moment` holds for them (`what` names it)."""
    deadline = time.monotonic() + 600
    while True:
        tis = cluster.airflow.task_instances(RUN_DAG_ID, run_id)
        if moment(tis):
            return tis
        assert time.monotonic() < deadline, (what, [(t["task_id"], t["state"]) for t in tis])
        time.sleep(1.0)


def _train(tis: TaskInstances) -> dict[str, Any]:
    (train,) = [t for t in tis if t["task_id"] == TRAIN]
    return train


def _rerun_of_seed(cluster: Cluster, submission: Submission, name: str) -> tuple[str, dict]:
    """The run id and conf of seed SEED's undisturbed run, in a run folder of its own."""
    assert submission.state == "success"
    conf = dict(cluster.airflow.dag_run(RUN_DAG_ID, submission.runs[SEED])["conf"])
    conf["run_dir"] = str(cluster.storage / "faults" / name)
    return f"fault__{name}", conf


def _held_training(
    cluster: Cluster, submission: Submission, name: str
) -> tuple[str, dict, str, str]:
    """Trigger the rerun `name` with the sbatch hook armed: (run id, conf, the hostname of the
    worker whose training task is held in sbatch, the held job's id)."""
    run_id, conf = _rerun_of_seed(cluster, submission, name)
    (cluster.hooks / "armed").touch()  # the next sbatch is this run's training
    cluster.airflow.trigger(RUN_DAG_ID, conf, run_id=run_id)
    host, job_id = _wait_for(cluster.hooks / "submitted", cluster, 600).split()
    train = _train(cluster.airflow.task_instances(RUN_DAG_ID, run_id))
    assert train["state"] == "running" and train["hostname"] == host, train
    return run_id, conf, host, job_id


def _release(cluster: Cluster, job_id: str) -> None:
    """Let the held training task leave sbatch, and its job run."""
    (cluster.hooks / "release").touch()
    cluster.slurm.client("scontrol", "release", job_id)


def _assert_undisturbed(
    cluster: Cluster, submission: Submission, run_id: str, conf: dict, state: str
) -> dict[str, list[tuple[str, str]]]:
    """The run passed as the undisturbed one did, with one Slurm job per job name, each ended
    (the evaluations that passed or failed, completed); returns the jobs by label."""
    tis = cluster.airflow.task_instances(RUN_DAG_ID, run_id)
    assert state == "success", cluster.airflow.failure_report(RUN_DAG_ID, run_id)
    jobs = run_jobs(cluster.slurm, RUN_DAG_ID, run_id)
    assert "train" in jobs, jobs
    for label, found in jobs.items():
        assert len(found) == 1 and found[0][1] in ENDED, (label, found)
    for t in tis:
        if t["task_id"] == EVALUATE and t["state"] == "success":
            step = int(t["rendered_map_index"].removeprefix("step "))
            assert [s for _, s in jobs[f"eval-{step}"]] == ["COMPLETED"], (step, jobs)
    assert deterministic_record(Path(conf["run_dir"]), SEED) == deterministic_record(
        submission.run_dir(SEED), SEED
    )
    return jobs


def test_a_worker_killed_while_its_task_submits_a_slurm_job(
    cluster: Cluster, submission: Submission
) -> None:
    airflow = cluster.airflow
    run_id, conf, host, job_id = _held_training(cluster, submission, "worker_kill")
    (killed,) = [n for n, w in airflow.workers.items() if w.host == host]
    airflow.kill(killed)
    try:
        # the job is held (the hook): released once the retry took it over and deferred
        retry = _train(
            _wait_for_tis(
                cluster,
                run_id,
                "the training's retry deferred",
                lambda tis: _train(tis)["try_number"] >= 2 and _train(tis)["state"] == "deferred",
            )
        )
    finally:
        # back before the rest of the run: worker-1 alone serves the default queue
        airflow.restart(killed)
    cluster.slurm.client("scontrol", "release", job_id)
    state = airflow.wait_for_run(RUN_DAG_ID, run_id, 1800)

    train = _train(airflow.task_instances(RUN_DAG_ID, run_id))
    jobs = _assert_undisturbed(cluster, submission, run_id, conf, state)
    # retried, on the other worker (the killed one stayed down until the retry had deferred)
    assert retry["hostname"] not in ("", None, host), retry
    assert train["try_number"] == retry["try_number"], train
    # one training job: the one the killed try submitted, adopted
    assert jobs["train"] == [(job_id, "COMPLETED")]


def _train_job(cluster: Cluster, run_id: str) -> tuple[str, str]:
    """(job id, state) of the run's training job (none yet: empty strings)."""
    found = run_jobs(cluster.slurm, RUN_DAG_ID, run_id).get("train", [])
    assert len(found) <= 1, found
    return found[0] if found else ("", "")


def _watched_and_waiting(tis: TaskInstances) -> bool:
    """The training's job watched and the evaluation waits deferred, all on a triggerer."""
    deferred = [t for t in tis if t["task_id"] in (TRAIN, WAIT) and t["state"] == "deferred"]
    return (
        _train(tis)["state"] == "deferred"
        and any(t["task_id"] == WAIT for t in deferred)
        and all(t["triggerer_job"] for t in deferred)
    )


def test_the_triggerer_restarted_while_the_waits_are_deferred(
    cluster: Cluster, submission: Submission
) -> None:
    airflow = cluster.airflow
    run_id, conf = _rerun_of_seed(cluster, submission, "triggerer_restart")
    airflow.trigger(RUN_DAG_ID, conf, run_id=run_id)
    tis = _wait_for_tis(cluster, run_id, "the waits deferred", _watched_and_waiting)
    waits = [t["map_index"] for t in tis if t["task_id"] == WAIT and t["state"] == "deferred"]
    airflow.kill("triggerer")
    try:
        # the training's job ends while no triggerer watches it
        deadline = time.monotonic() + 900
        while (train_job := _train_job(cluster, run_id))[1] in ("", *ACTIVE):
            airflow.check_alive()
            assert time.monotonic() < deadline, train_job
            time.sleep(1.0)
        assert train_job[1] == "COMPLETED", train_job
        # nothing could resume the deferred tasks meanwhile
        tis = airflow.task_instances(RUN_DAG_ID, run_id)
        assert _train(tis)["state"] == "deferred", _train(tis)
        for t in tis:
            if t["task_id"] == WAIT and t["map_index"] in waits:
                assert t["state"] == "deferred", t
    finally:
        airflow.restart("triggerer")
    state = airflow.wait_for_run(RUN_DAG_ID, run_id, 1800)
    _assert_undisturbed(cluster, submission, run_id, conf, state)


def test_a_scheduler_killed_while_a_task_it_queued_runs(
    cluster: Cluster, submission: Submission
) -> None:
    airflow = cluster.airflow
    run_id, conf, _, job_id = _held_training(cluster, submission, "scheduler_kill")
    killed = airflow.scheduler_of(RUN_DAG_ID, run_id, TRAIN)
    airflow.kill(killed)
    try:
        _release(cluster, job_id)
        # the other scheduler carries the run (the killed one stays down until its end)
        state = airflow.wait_for_run(RUN_DAG_ID, run_id, 1800)
    finally:
        airflow.restart(killed)
    jobs = _assert_undisturbed(cluster, submission, run_id, conf, state)
    assert jobs["train"] == [(job_id, "COMPLETED")]


def test_the_broker_restarted_while_a_task_runs(cluster: Cluster, submission: Submission) -> None:
    airflow = cluster.airflow
    run_id, conf, _, job_id = _held_training(cluster, submission, "broker_restart")
    # nothing queued: a queued task's message would go with the broker's memory (nothing else
    # can be queued while the training is held: every other task waits on it)
    _wait_for_tis(
        cluster, run_id, "nothing queued", lambda tis: all(t["state"] != "queued" for t in tis)
    )
    try:
        airflow.redis.restart()
        airflow.wait_workers_answer()
    finally:
        _release(cluster, job_id)
    state = airflow.wait_for_run(RUN_DAG_ID, run_id, 1800)
    jobs = _assert_undisturbed(cluster, submission, run_id, conf, state)
    assert jobs["train"] == [(job_id, "COMPLETED")]
