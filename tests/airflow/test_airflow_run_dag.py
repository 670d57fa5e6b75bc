"""dag.test() of mlperf_grpo_run end to end on a short configuration of the real jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow_harness import (
    CONVERGING_RUN,
    Recording,
    failures,
    launched_jobs,
    run_dag_test,
    write_deployment,
)

from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from rcpflow.records.mllog import read_events
from tasks.results.verdicts import read_verdict


@pytest.mark.timeout(600)
def test_run_dag_trains_evaluates_until_the_target_and_checks(
    airflow_db: str, tmp_path: Path, run_dir: Path, recording: Recording
) -> None:
    deployment = write_deployment(tmp_path / "deployment.toml", python=str(recording.python))
    conf = {**CONVERGING_RUN, "run_dir": str(run_dir)}

    result = run_dag_test("mlperf_grpo_run", conf, deployment)

    assert result.state == "success", failures(result)
    assert result.states[("train.job.run", -1)] == "success"
    assert result.states[("train.check_outputs", -1)] == "success"
    layout = RunLayout(str(run_dir))
    rows = load(layout.manifest).rows
    first, last = CONVERGING_RUN["val_start_at"], CONVERGING_RUN["max_steps"]
    assert [r.step for r in rows] == list(range(first, last + 1))  # a checkpoint per step
    events = read_events(layout.mllog(1))
    (stop,) = [e for e in events if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    passed = stop.metadata["samples_count"] // 256
    assert stop.time_ms == next(r.timestamp_ms for r in rows if r.step == passed)
    logged = {
        e.metadata["samples_count"] // 256: float(e.value)
        for e in events
        if e.key == "eval_accuracy"
    }
    # the log holds every step from the first up to the first one above 0.69, and no later one
    assert first < passed < last  # the toy learns: some steps below, some left to skip
    assert sorted(logged) == list(range(first, passed + 1))
    assert all(acc <= 0.69 for step, acc in logged.items() if step < passed)
    assert logged[passed] > 0.69
    # each logged step was evaluated by a real job; no job is launched twice; dag.test runs
    # mapped instances in random order, so a later step may have been evaluated speculatively
    jobs = launched_jobs(recording.record)
    assert sum(j.split()[1] == "tpu_jobs.train" for j in jobs) == 1
    evaluated = [int(j.split("--step ")[1]) for j in jobs if j.split()[1] == "tpu_jobs.evaluate"]
    assert len(evaluated) == len(set(evaluated))
    assert set(range(first, passed + 1)) <= set(evaluated)
    for step in evaluated:
        assert json.loads(Path(layout.summary(step)).read_text())["checkpoint_step"] == step
    # instances for steps after the passing one are skipped unless they ran first
    states = dict(
        zip(range(first, last + 1), result.mapped("evaluation.checkpoint.evaluate"), strict=True)
    )
    assert all(states[s] == "success" for s in range(first, passed + 1))
    assert all(states[s] in ("skipped", "success") for s in range(passed + 1, last + 1))
    verdict = read_verdict(str(run_dir), "compliance_checker")
    assert verdict is not None and verdict.ok, verdict
    assert result.states[("evaluation.check", -1)] == "success"


@pytest.mark.timeout(300)
def test_a_second_dag_run_on_a_live_run_folder_starts_nothing_there(
    airflow_db: str, tmp_path: Path, run_dir: Path, recording: Recording
) -> None:
    """Another DAG run's training holds the folder (its lease): this run's plan refuses it in
    one line naming the holder; no job starts (neither a training, which the lease would refuse
    anyway, nor an evaluation of the live run's checkpoints) and nothing is written there."""
    from rcpflow.trainer import ownership

    deployment = write_deployment(tmp_path / "deployment.toml", python=str(recording.python))
    run_dir.mkdir(parents=True, exist_ok=True)
    live = ownership.airflow_owner("mlperf_grpo_run", "the_live_run", "train.job.run")
    ownership.hold(str(run_dir), live, timeout_s=600)
    before = sorted(p.name for p in run_dir.iterdir())

    result = run_dag_test(
        "mlperf_grpo_run", {**CONVERGING_RUN, "run_dir": str(run_dir)}, deployment
    )

    assert result.state == "failed"
    assert result.states[("plan", -1)] == "failed"
    ran = {t: s for (t, _), s in result.states.items() if s not in ("upstream_failed", "skipped")}
    assert ran == {"plan": "failed", "train.job.cleanup": "success"}, ran  # a teardown, no record
    assert launched_jobs(recording.record) == []
    assert sorted(p.name for p in run_dir.iterdir()) == before  # the lease alone
