"""mlperf_grpo_run under a real scheduler on the Slurm backend, against the private Slurm
(`devtools.servers.slurm_cluster`, sbatch on this machine), with the NeMo-RL-shaped jobs
(tests/foreign/nemo_*.py), as test_airflow_nemo_rl does on the local backend: the trainer's
sbatch job gets MLPERF_MLLOG_FILE (the run folder's MLLOG, `tasks.backend_api.job_inputs`) and
leaves its step_<N>/ tree, which the run DAG imports as the manifest while training runs (the
checkpoint waits, `during_training`) and after it (the output check); each checkpoint's
deferred evaluation is its own sbatch job; rcpflow finalizes the run and every checker passes.

Not dag.test(): it runs one task at a time, and a wait deferred while the Slurm training is
submitted but not done would hold it forever (the train group is running)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow_harness import (
    HOME,
    DagRunResult,
    failures,
    launched_jobs,
    recording_python,
    run_under_scheduler,
)
from foreign.deployment import (
    FOREIGN_RUN,
    NEMO_EVALUATOR,
    NEMO_TRAINER,
    PASSING_STEP,
    write_nemo_slurm_deployment,
)
from foreign_runs import (
    assert_decided_at_the_passing_step,
    assert_nemo_outputs_imported,
)

from devtools.servers import slurm_cluster
from devtools.servers.airflow_server import LocalAirflow
from devtools.servers.slurm_cluster import NodeSpec, SlurmCluster
from tasks.results.verdicts import read_verdict, verdict_path

FIRST, LAST = FOREIGN_RUN["val_start_at"], FOREIGN_RUN["max_steps"]
STEP_SECONDS = 5.0  # the training lasts ~30 s: the first checkpoint is evaluated during it


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    """The private Slurm (as tests/tasks/backends/slurm/conftest.py starts it, without REST)."""
    missing = slurm_cluster.missing_binaries()
    if missing:
        message = f"a private Slurm: not installed: {', '.join(missing)} (make system-packages)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    cluster = SlurmCluster((NodeSpec("n1", cpus=4), NodeSpec("n2", cpus=4)))
    with cluster:
        yield cluster
    cluster.cleanup()


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory,
    start_airflow: Callable[..., Any],
    slurm: SlurmCluster,
) -> Iterator[tuple[LocalAirflow, Path]]:
    """A real Airflow whose deployment is the NeMo-RL pair on the private Slurm; the file the
    jobs' interpreter records their arguments in."""
    folder = tmp_path_factory.mktemp("nemo_slurm")
    python, record = recording_python(folder)
    jobs_dir = folder / "jobs"
    (jobs_dir / "logs").mkdir(parents=True)
    deployment = write_nemo_slurm_deployment(
        folder / "deployment.toml",
        python=str(python),
        jobs_dir=jobs_dir,
        eval_schedule="during_training",
        step_seconds=STEP_SECONDS,
    )
    env = {"RCPFLOW_DEPLOYMENT": str(deployment), **slurm.env}  # SLURM_CONF: sbatch & co.
    with start_airflow(tmp_path_factory.mktemp("airflow"), env) as server:
        yield server, record


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_nemo_rl_run_on_slurm_under_the_scheduler_ends_compliant(
    setup: tuple[LocalAirflow, Path], tmp_path: Path
) -> None:
    server, record = setup
    run_dir = tmp_path / "run"

    run = run_under_scheduler(
        server, "mlperf_grpo_run", {**FOREIGN_RUN, "run_dir": str(run_dir)}, timeout_s=600
    )

    assert run.state == "success", failures(run, server)
    # during_training on Slurm: the checkpoint waits imported the trainer's tree as it grew
    # (no row before the output check otherwise), so step 2 was evaluated while it trained.
    (train,) = [t for t in run.tis if t["task_id"] == "train.job.run"]
    (first,) = [
        t
        for t in run.tis
        if t["task_id"] == "evaluation.checkpoint.evaluate" and t["map_index"] == 0
    ]
    assert first["state"] == "success" and first["start_date"] < train["end_date"], (first, train)
    jobs = launched_jobs(record)
    assert jobs[0].startswith(f"{NEMO_TRAINER} --checkpoint-dir {run_dir}/checkpoints ")
    assert all(j.startswith(str(NEMO_EVALUATOR)) for j in jobs[1:])
    ran = list(range(FIRST, PASSING_STEP + 1))
    assert_nemo_outputs_imported(run_dir, ran)
    # The trainer wrote its MLLOG where the sbatch job's MLPERF_MLLOG_FILE said: the run's.
    events = assert_decided_at_the_passing_step(run_dir, ran)
    assert len([e for e in events if e.key == "tracked_stats"]) == LAST + len(ran)
    checkers = sorted(p.stem for p in Path(verdict_path(str(run_dir), "x")).parent.glob("*.json"))
    assert "compliance_checker" in checkers
    for checker in checkers:
        verdict = read_verdict(str(run_dir), checker)
        assert verdict is not None and verdict.ok, (checker, verdict)


def test_a_failed_run_names_each_failed_task_and_the_end_of_its_log() -> None:
    """What a DAG run's failed assert prints (`airflow_harness.failures`): each failed task's
    id and the last lines of its log, so that a lost verdict says which task and why."""
    task = "evaluation.checkpoint.evaluate"
    log = Path(
        HOME, "logs", "dag_id=d", "run_id=r", f"task_id={task}", "map_index=1", "attempt=1.log"
    )
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(f"line {i}\n" for i in range(40)) + "step 2: no summary written\n")
    states = {(task, 1): "failed", (task, 0): "success", ("train.job.run", -1): "success"}
    text = failures(DagRunResult("failed", states, {}))
    assert f"--- {task}[1]: failed; the end of its log:" in text
    assert "step 2: no summary written" in text and "line 0\n" not in text
    assert f"{task}[0]: success" not in text.split("---", 1)[1]
