"""dag.test() of mlperf_grpo_deferred_eval on prepared runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow_harness import launched_jobs, recording_python, run_dag_test, write_deployment
from synthetic_run import make_run

from rcpflow.mllog import read_events

EVALUATE = "evaluation.evaluate"


@pytest.mark.timeout(300)
def test_decided_run_launches_no_job_and_stops_at_the_first_pass(
    airflow_db: str, tmp_path: Path
) -> None:
    # val_start 18 at gbs 256; step 20 is the first above 0.69 (21 is too, but later).
    run = make_run(
        str(tmp_path / "run"),
        max_steps=24,
        accuracies={18: 0.40, 19: 0.60, 20: 0.75, 21: 0.80},
    )
    python, record = recording_python(tmp_path)
    deployment = write_deployment(tmp_path / "deployment.toml", python=str(python))

    result = run_dag_test("mlperf_grpo_deferred_eval", {"run_dir": run.run_dir}, deployment)

    assert result.state == "success", result.states
    assert launched_jobs(record) == []  # every needed summary was already there
    # steps 18..24: 18-20 evaluated (reused), 21-24 skipped because 20 passed
    assert result.mapped(EVALUATE) == ["success"] * 3 + ["skipped"] * 4
    assert result.states[("evaluation.finalize", -1)] == "success"
    assert result.states[("evaluation.check", -1)] == "success"
    stops = [e for e in read_events(run.layout.mllog(1)) if e.key == "run_stop"]
    assert len(stops) == 1
    assert stops[0].metadata["status"] == "success"
    assert stops[0].metadata["samples_count"] == 20 * 256
    assert stops[0].time_ms == run.row(20).timestamp_ms


@pytest.mark.timeout(300)
def test_gke_backend_takes_the_same_gate_before_touching_a_cluster(
    airflow_db: str, tmp_path: Path
) -> None:
    # No cluster exists here: the run can only succeed if no JobSet is created, i.e. if the
    # GKE evaluate operator reuses the persisted summaries and skips the decided steps.
    run = make_run(str(tmp_path / "run"), max_steps=22, accuracies={18: 0.5, 19: 0.8})
    deployment = tmp_path / "gke.toml"
    deployment.write_text(
        'backend = "gke"\n[gke]\nproject_id = "p"\ncluster_name = "c"\nimage = "i:1"\n'
    )

    result = run_dag_test("mlperf_grpo_deferred_eval", {"run_dir": run.run_dir}, deployment)

    assert result.state == "success", result.states
    assert result.mapped(EVALUATE) == ["success", "success", "skipped", "skipped", "skipped"]
    assert result.states[("evaluation.cleanup", -1)] == "success"
    assert result.states[("evaluation.check", -1)] == "success"
