"""dag.test() of mlperf_grpo_deferred_eval on prepared runs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from airflow_harness import (
    DagRunResult,
    failures,
    launched_jobs,
    recording_python,
    run_dag_test,
    train_fast_run,
    write_deployment,
)

from devtools.synthetic_run import SyntheticRun, attempts_for_accuracy, make_run
from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from rcpflow.records.mllog import read_events
from rcpflow.records.summary import build_summary, read_summary, write_summary

EVALUATE = "evaluation.evaluate"


def _evaluate(run_dir: str, tmp_path: Path) -> tuple[DagRunResult, list[str]]:
    """mlperf_grpo_deferred_eval on `run_dir`, its jobs run by the recording interpreter: the
    DAG run's result and the jobs it launched."""
    python, record = recording_python(tmp_path)
    deployment = write_deployment(tmp_path / "deployment.toml", python=str(python))
    result = run_dag_test("mlperf_grpo_deferred_eval", {"run_dir": run_dir}, deployment)
    return result, launched_jobs(record)


def _evaluate_synthetic(tmp_path: Path, **run: Any) -> tuple[SyntheticRun, DagRunResult, list[str]]:
    """`_evaluate` of a synthetic run made by `make_run(tmp_path / "run", **run)`."""
    made = make_run(str(tmp_path / "run"), **run)
    return (made, *_evaluate(made.run_dir, tmp_path))


@pytest.mark.timeout(300)
def test_decided_run_launches_no_job_and_stops_at_the_first_pass(
    airflow_db: str, tmp_path: Path
) -> None:
    # val_start 18 at gbs 256; step 20 is the first above 0.69 (21 is too, but later).
    run, result, jobs = _evaluate_synthetic(
        tmp_path, max_steps=24, accuracies={18: 0.40, 19: 0.60, 20: 0.75, 21: 0.80}
    )

    assert result.state == "success", failures(result)
    assert jobs == []  # every needed summary was already there
    # steps 18..24: 18-20 evaluated (reused), 21-24 skipped because 20 passed
    assert result.mapped(EVALUATE) == ["success"] * 3 + ["skipped"] * 4
    # labelled by step before anything runs, so the skipped ones are too
    assert result.mapped_labels(EVALUATE) == [f"step {s}" for s in range(18, 25)]
    assert result.states[("evaluation.finalize", -1)] == "success"
    assert result.states[("evaluation.check", -1)] == "success"
    stops = [e for e in read_events(run.layout.mllog(1)) if e.key == "run_stop"]
    assert len(stops) == 1
    assert stops[0].metadata["status"] == "success"
    assert stops[0].metadata["samples_count"] == 20 * 256
    assert stops[0].time_ms == run.row(20).timestamp_ms
    # finalize and check published what they wrote, pointing at the RCP view of this DAG run
    events = _asset_events()
    mllog = events[f"file://{run.layout.mllog(1)}"]
    assert mllog["status"] == "success" and mllog["step"] == 20
    assert mllog["rcp_view"].startswith("/rcp/dag-run/mlperf_grpo_deferred_eval/")
    verdict = events[f"file://{run.run_dir}/checks/compliance_checker.json"]
    assert verdict["ok"] is True and verdict["rcp_view"] == mllog["rcp_view"]


def _asset_events() -> dict[str, dict]:
    """Extra of the last event of every asset, by URI."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetModel.uri, AssetEvent.extra)
            .join(AssetEvent, AssetEvent.asset_id == AssetModel.id)
            .order_by(AssetEvent.id)
        ).all()
    return {uri: dict(extra) for uri, extra in rows}


@pytest.mark.timeout(300)
def test_gke_backend_takes_the_same_gate_before_touching_a_cluster(
    airflow_db: str, tmp_path: Path
) -> None:
    # No cluster exists here: the run can only succeed if no JobSet is created, i.e. if the
    # GKE evaluate operator reuses the persisted summaries and skips the decided steps.
    run = make_run(str(tmp_path / "run"), max_steps=22, accuracies={18: 0.5, 19: 0.8})
    deployment = tmp_path / "gke.toml"
    deployment.write_text(
        'backend = "gke"\nallow_run_dirs_outside_root = true\n'
        '[gke]\nproject_id = "p"\ncluster_name = "c"\nimage = "i:1"\n'
    )

    result = run_dag_test("mlperf_grpo_deferred_eval", {"run_dir": run.run_dir}, deployment)

    assert result.state == "success", failures(result)
    assert result.mapped(EVALUATE) == ["success", "success", "skipped", "skipped", "skipped"]
    assert result.mapped_labels(EVALUATE) == [f"step {s}" for s in range(18, 23)]
    assert result.states[("evaluation.cleanup", -1)] == "success"
    assert result.states[("evaluation.check", -1)] == "success"


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real training run of the fast configuration (checkpoints of steps 2..6)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    train_fast_run(run_dir)
    return run_dir


@pytest.fixture
def run_dir(trained_run: Path, tmp_path: Path) -> Path:
    """This test's own copy of `trained_run`, to change as it likes."""
    return shutil.copytree(trained_run, tmp_path / "run")


def _plant_summary(run_dir: Path, step: int, accuracy: float) -> None:
    """Prepare the run: a valid summary for `step` with the given pass@4, written through
    rcpflow for the real manifest row (the toy cannot pass after 6 tiny steps)."""
    layout = RunLayout(str(run_dir))
    row = load(layout.manifest).row(step)
    summary = build_summary(
        attempts_for_accuracy(accuracy),
        checkpoint=row,
        target_accuracy=row.target_accuracy,
        eval_start_ms=row.timestamp_ms + 60_000,
        eval_stop_ms=row.timestamp_ms + 61_000,
    )
    write_summary(layout.summary(step), summary)


@pytest.mark.timeout(600)
def test_real_jobs_evaluate_below_a_passing_middle_checkpoint(
    airflow_db: str, run_dir: Path, tmp_path: Path
) -> None:
    _plant_summary(run_dir, 4, 0.80)

    result, jobs = _evaluate(str(run_dir), tmp_path)

    assert result.state == "success", failures(result)
    # steps 2..6: 2 and 3 evaluated by the real evaluator, 4 reused, 5 and 6 skipped
    assert result.mapped(EVALUATE) == ["success"] * 3 + ["skipped"] * 2
    assert sorted(jobs) == [
        f"-m tpu_jobs.evaluate --run-dir {run_dir} --step 2",
        f"-m tpu_jobs.evaluate --run-dir {run_dir} --step 3",
    ]
    layout = RunLayout(str(run_dir))
    events = read_events(layout.mllog(1))
    assert [e.metadata["samples_count"] for e in events if e.key == "eval_accuracy"] == [32, 48, 64]
    (stop,) = [e for e in events if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    assert stop.time_ms == load(layout.manifest).row(4).timestamp_ms
    assert result.states[("evaluation.check", -1)] == "success"  # the official checker agrees


@pytest.mark.timeout(600)
def test_a_failing_evaluation_fails_the_task_and_writes_no_run_stop(
    airflow_db: str, run_dir: Path, tmp_path: Path
) -> None:
    # Damage step 3's checkpoint: its weights no longer restore, the evaluator fails (exit 3).
    for path in (run_dir / "checkpoints" / "3").rglob("*"):
        if path.is_file() and path.parent.name != "3":
            path.write_bytes(b"not a checkpoint")

    result = run_dag_test(
        "mlperf_grpo_deferred_eval",
        {"run_dir": str(run_dir)},
        write_deployment(tmp_path / "d.toml"),
    )

    assert result.state == "failed"
    assert result.mapped(EVALUATE)[1] == "failed"  # step 3
    assert result.states[("evaluation.finalize", -1)] == "upstream_failed"
    layout = RunLayout(str(run_dir))
    assert "run_stop" not in {e.key for e in read_events(layout.mllog(1))}
    summary = read_summary(layout.summary(3))
    assert summary.fatal_error  # the evaluator recorded why; never a valid summary


@pytest.mark.timeout(300)
def test_a_run_without_a_verdict_fails_finalize_and_gets_no_run_stop(
    airflow_db: str, tmp_path: Path
) -> None:
    # Training stopped at step 20 of 24 and no checkpoint passed: not aborted, incomplete.
    run, result, jobs = _evaluate_synthetic(
        tmp_path, max_steps=24, last_step=20, accuracies={18: 0.3, 19: 0.4, 20: 0.5}
    )

    assert result.state == "failed"
    assert jobs == []
    assert result.mapped(EVALUATE) == ["success"] * 3
    assert result.states[("evaluation.finalize", -1)] == "failed"
    assert result.states[("evaluation.check", -1)] == "upstream_failed"
    assert "run_stop" not in {e.key for e in read_events(run.layout.mllog(1))}
