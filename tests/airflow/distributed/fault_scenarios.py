"""The faults of a distributed deployment, written once for every backend: each scenario reruns
the undisturbed submission's seed 1 (same conf, a run folder of its own) and disturbs it; the
backend's side (`FaultTarget`: the Slurm tests' `SlurmFaults`, the GKE tests' `GkeFaults`)
holds the run's training at its hook point, lets it go, and tells whether the run is the
undisturbed one's with one cluster job per job name, none left running.

The hook point is the training's job creation (``sbatch`` on Slurm, the JobSet create on GKE):
the training task is held in its worker right after the cluster accepted the job, before
Airflow recorded it, and the job is held pending (Slurm's hold; on GKE its pod is not started).

Two faults share each rerun (a rerun is a whole run: minutes), so that the GKE path's faults
cost about the suite time that sharing saved on the Slurm path:

- `worker_killed_then_triggerer_lost`: the test SIGKILLs the held task's worker's whole
  namespace (a host lost); the scheduler fails the task once its heartbeat stops, and its
  retry, on the other worker, adopts the job by its name instead of submitting a second. Once
  the training's watch and the evaluation waits are deferred, the test SIGKILLs the triggerer
  that runs the training's watch (of the two the harness runs, as Composer and the Helm chart
  do) and lets the job run: the other triggerer takes the triggers over once the lost one's
  heartbeat is stale, follows the job to its end and ends the task. No job is cancelled by the
  move (apache/airflow#73454 reports ``on_kill`` on a reassignment: rcpflow's triggers cancel
  nothing there, `tests/tasks/backend_api/test_lifecycle.py`), none submitted twice, and the
  verdict is the undisturbed run's. The lost triggerer comes back at the end.
- `scheduler_killed_and_broker_restarted`: the test SIGKILLs the scheduler that queued the held
  task (`scheduler_of`); with the task running and nothing queued, Redis is stopped and started
  again (empty: it keeps nothing on disk) and both workers answer Celery's ping on the new one;
  then the task goes on. The other scheduler carries the rest of the run through the new
  broker; the killed one is started again at the end."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcpflow.files import logtext
from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import parse_rows
from rcpflow.records.mllog import read_events
from tasks.names import RUN_DAG_ID

TRAIN = "train.job.run"
WAIT = "evaluation.checkpoint.wait"
EVALUATE = "evaluation.checkpoint.evaluate"
SEED = 1

TaskInstances = list[dict[str, Any]]


def deterministic_record(run_dir: str | Path, seed: int) -> dict[str, Any]:
    """What a run's outcome is, without its clocks: the MLLOG's eval events (step, accuracy),
    its run_stop (status, samples), the manifest's steps; timestamps and paths differ between
    two runs of one conf, these do not. `run_dir` local or ``gs://``."""
    layout = RunLayout(str(run_dir))
    events = read_events(layout.mllog(seed))
    evals = [
        (e.metadata.get("epoch_num", e.metadata.get("step")), e.value)
        for e in events
        if e.key == "eval_accuracy"
    ]
    (stop,) = [e for e in events if e.key == "run_stop"]
    rows = parse_rows(logtext.read(layout.manifest), layout.manifest)
    return {
        "eval_accuracy": evals,
        "run_stop": {k: stop.metadata.get(k) for k in ("status", "samples_count")},
        "manifest_steps": [r.step for r in rows],
        "keys": sorted({e.key for e in events}),
    }


def wait_for_file(path: Path, airflow: Any, timeout_s: float) -> str:
    """The text of `path` once it is written; the file is taken (the next fault waits anew)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        airflow.check_alive()
        assert time.monotonic() < deadline, f"{path} not written after {timeout_s}s"
        time.sleep(0.2)
    text = path.read_text()
    path.unlink()
    return text


@dataclass(frozen=True)
class FaultTarget:
    """A backend's side of the scenarios, on its distributed Airflow: the hook's folder (the
    files ``armed``, ``submitted`` and ``release``: the conftest's SBATCH_HOOK, the GKE
    module's CREATE_HOOK) and the reruns of seed SEED's undisturbed run are shared; a backend
    (`SlurmFaults`, `GkeFaults`) supplies the methods that raise NotImplementedError here."""

    airflow: Any
    hooks: Path
    undisturbed_run_id: str  # seed SEED's run of the undisturbed submission
    undisturbed_dir: str  # its run folder
    faults_root: str  # each rerun's run folder goes under it

    def rerun(self, name: str) -> tuple[str, dict[str, Any]]:
        """The run id and conf of seed SEED's undisturbed run, in a run folder of its own."""
        conf = dict(self.airflow.dag_run(RUN_DAG_ID, self.undisturbed_run_id)["conf"])
        conf["run_dir"] = f"{self.faults_root}/{name}"
        return f"fault__{name}", conf

    def arm(self, run_id: str) -> None:
        """Hold the next job creation (the run's training) in its task, and its job pending."""
        (self.hooks / "armed").touch()

    def held(self) -> tuple[str, str]:
        """Once a task is held at the hook point: (its worker's hostname, its job's id)."""
        host, job = wait_for_file(self.hooks / "submitted", self.airflow, 600).split()
        return host, job

    def let_task_go(self) -> None:
        """Let the held task leave the hook point (nothing if its worker was killed)."""
        (self.hooks / "release").touch()

    def assert_same_record(self, conf: dict[str, Any]) -> None:
        """The rerun's outcome is the undisturbed run's (`deterministic_record`)."""
        assert deterministic_record(conf["run_dir"], SEED) == deterministic_record(
            self.undisturbed_dir, SEED
        )

    def let_job_run(self, run_id: str, job: str) -> None:
        """Let the held job of `run_id` run."""
        raise NotImplementedError

    def training_ended(self, run_id: str) -> bool:
        """Whether the run's training job has ended (asserted: with success)."""
        raise NotImplementedError

    def assert_undisturbed(self, run_id: str, conf: dict[str, Any], state: str) -> str:
        """The run passed as the undisturbed one did, with one cluster job per job name, each
        ended and none left; the training job's id."""
        raise NotImplementedError


def wait_for_tis(
    airflow: Any, run_id: str, what: str, moment: Callable[[TaskInstances], bool]
) -> TaskInstances:
    """The run's task instances once `moment` holds for them (`what` names it)."""
    deadline = time.monotonic() + 600
    while True:
        tis: TaskInstances = airflow.task_instances(RUN_DAG_ID, run_id)
        if moment(tis):
            return tis
        assert time.monotonic() < deadline, (
            f"{what}: not within 600 s",
            [
                (t["task_id"], t["map_index"], t["state"], t["try_number"], t["hostname"])
                for t in tis
            ],
        )
        time.sleep(1.0)


def train_ti(tis: TaskInstances) -> dict[str, Any]:
    (train,) = [t for t in tis if t["task_id"] == TRAIN]
    return train


def _held_training(target: FaultTarget, name: str) -> tuple[str, dict[str, Any], str, str]:
    """Trigger the rerun `name` with the hook armed: (run id, conf, the hostname of the worker
    whose training task is held, the held job's id)."""
    run_id, conf = target.rerun(name)
    target.arm(run_id)
    target.airflow.trigger(RUN_DAG_ID, conf, run_id=run_id)
    host, job = target.held()
    train = train_ti(target.airflow.task_instances(RUN_DAG_ID, run_id))
    assert train["state"] == "running" and train["hostname"] == host, train
    return run_id, conf, host, job


def _watched_and_waiting(tis: TaskInstances) -> bool:
    """The training's job watched and the evaluation waits deferred, all on a triggerer."""
    deferred = [t for t in tis if t["task_id"] in (TRAIN, WAIT) and t["state"] == "deferred"]
    return (
        train_ti(tis)["state"] == "deferred"
        and any(t["task_id"] == WAIT for t in deferred)
        and all(t["triggerer_job"] for t in deferred)
    )


def worker_killed_then_triggerer_lost(target: FaultTarget, name: str) -> None:
    airflow = target.airflow
    run_id, conf, host, job = _held_training(target, name)
    (killed,) = [n for n, w in airflow.workers.items() if w.host == host]
    airflow.kill(killed)
    try:
        # the job is held: it runs once the retry took it over and deferred
        retry = train_ti(
            wait_for_tis(
                airflow,
                run_id,
                "the training's retry deferred",
                lambda tis: (
                    train_ti(tis)["try_number"] >= 2 and train_ti(tis)["state"] == "deferred"
                ),
            )
        )
    finally:
        # back before the rest of the run (the Slurm path: worker-1 alone serves `default`)
        airflow.restart(killed)
    tis = wait_for_tis(airflow, run_id, "the waits deferred", _watched_and_waiting)
    lost_job = train_ti(tis)["triggerer_job"]["id"]
    lost = airflow.triggerer_of(lost_job)
    airflow.kill(lost)
    try:
        # the training's job runs; the other triggerer takes its watch over and sees it end
        target.let_job_run(run_id, job)
        taken = train_ti(
            wait_for_tis(
                airflow,
                run_id,
                "the training's watch taken over by the other triggerer",
                lambda tis: (
                    train_ti(tis)["state"] != "deferred"
                    or (train_ti(tis)["triggerer_job"] or {}).get("id") not in (None, lost_job)
                ),
            )
        )
        state = airflow.wait_for_run(RUN_DAG_ID, run_id, 1800)
    finally:
        airflow.restart(lost)
    # the training's task was never resumed on a worker after the move: one try more than the
    # worker kill's retry would mean the watch was lost, not moved
    assert taken["try_number"] == retry["try_number"], taken

    train = train_ti(airflow.task_instances(RUN_DAG_ID, run_id))
    trained = target.assert_undisturbed(run_id, conf, state)
    assert target.training_ended(run_id)  # with success: the move cancelled nothing
    # retried, on the other worker (the killed one stayed down until the retry had deferred)
    assert retry["hostname"] not in ("", None, host), retry
    assert train["try_number"] == retry["try_number"], train
    # one training job: the one the killed try submitted, adopted
    assert trained == job


def scheduler_killed_and_broker_restarted(target: FaultTarget, name: str) -> None:
    airflow = target.airflow
    run_id, conf, _, job = _held_training(target, name)
    killed = airflow.scheduler_of(RUN_DAG_ID, run_id, TRAIN)
    airflow.kill(killed)
    try:
        # nothing queued: a queued task's message would go with the broker's memory (nothing
        # else can be queued while the training is held: every other task waits on it)
        wait_for_tis(
            airflow,
            run_id,
            "nothing queued",
            lambda tis: all(t["state"] != "queued" for t in tis),
        )
        try:
            airflow.redis.restart()
            airflow.wait_workers_answer()
        finally:
            target.let_task_go()
            target.let_job_run(run_id, job)
        # the other scheduler carries the run (the killed one stays down until its end)
        state = airflow.wait_for_run(RUN_DAG_ID, run_id, 1800)
    finally:
        airflow.restart(killed)
    assert target.assert_undisturbed(run_id, conf, state) == job
