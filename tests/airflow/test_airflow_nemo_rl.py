"""dag.test() of mlperf_grpo_run with NeMo-RL-shaped jobs (tests/foreign/nemo_*.py) from the
deployment's [jobs] templates: the trainer writes its own MLLOG (MLPERF_MLLOG_FILE, set by the
job template) and its step_<N>/ tree, which the run DAG imports as the manifest; the deferred
evaluator runs on a view of one checkpoint with a scratch MLLOG, whose accuracy is imported; the
run is finalized by rcpflow and every checker passes, under either schedule."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow_harness import launched_jobs, recording_python, run_dag_test
from foreign.deployment import (
    FOREIGN_RUN,
    NEMO_EVALUATOR,
    NEMO_TRAINER,
    PASSING_STEP,
    write_nemo_deployment,
)

from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from rcpflow.records.mllog import read_events
from rcpflow.records.summary import read_summary
from tasks.results.verdicts import read_verdict

FIRST, LAST = FOREIGN_RUN["val_start_at"], FOREIGN_RUN["max_steps"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("schedule", ["after_training", "during_training"])
def test_a_nemo_rl_run_through_the_run_dag_ends_compliant(
    airflow_db: str, tmp_path: Path, schedule: str
) -> None:
    run_dir = tmp_path / "run"
    python, record = recording_python(tmp_path)
    deployment = write_nemo_deployment(
        tmp_path / "d.toml", python=str(python), eval_schedule=schedule
    )

    result = run_dag_test("mlperf_grpo_run", {**FOREIGN_RUN, "run_dir": str(run_dir)}, deployment)

    assert result.state == "success", result.states
    jobs = launched_jobs(record)
    assert jobs[0].startswith(f"{NEMO_TRAINER} --checkpoint-dir {run_dir}/checkpoints ")
    layout = RunLayout(str(run_dir))
    manifest = load(layout.manifest)
    assert [r.step for r in manifest.rows] == list(range(FIRST, LAST + 1))
    assert manifest.row(FIRST).checkpoint_path == f"{run_dir}/checkpoints/step_{FIRST}"
    evaluated = sorted(int(j.split("/view/step_")[0].rsplit("step_", 1)[1]) if False else
                       int(j.split("--checkpoint-root ")[1].split("/view")[0].rsplit("_", 1)[1])
                       for j in jobs[1:])  # fmt: skip
    assert all(j.startswith(str(NEMO_EVALUATOR)) for j in jobs[1:])
    ran = list(range(FIRST, PASSING_STEP + 1))
    assert evaluated in (ran, [*ran, LAST])
    for step in ran:
        summary = read_summary(layout.summary(step))
        assert summary.attempt_records is False
        own = read_events(str(run_dir / "nemo_eval" / f"step_{step}" / "mllog.log"))
        start = next(e for e in own if e.key == "eval_start")
        assert summary.eval_start_ms == start.time_ms  # the evaluator's own eval times
        assert [e.key for e in own][-1] == "run_stop"  # its own: ignored
    events = read_events(layout.mllog(1))
    assert len([e for e in events if e.key == "tracked_stats"]) == LAST + len(ran)
    accuracies = [e for e in events if e.key == "eval_accuracy"]
    assert [e.metadata["samples_count"] for e in accuracies] == [s * 16 for s in ran]
    assert accuracies[-1].value == pytest.approx(176 / 251)
    (stop,) = [e for e in events if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    assert stop.time_ms == manifest.row(PASSING_STEP).timestamp_ms
    assert result.states[("evaluation.check", -1)] == "success"
    verdict = read_verdict(str(run_dir), "compliance_checker")
    assert verdict is not None and verdict.ok
