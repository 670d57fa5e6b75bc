"""A foreign pair (tests/foreign) through the run DAG, and what the run ends in: FOREIGN_RUN
decided at PASSING_STEP, as the Airflow tests of those pairs check it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from airflow_harness import DagRunResult, run_dag_test
from foreign.deployment import FOREIGN_RUN, PASSING_STEP

from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from rcpflow.records.mllog import Event, read_events
from rcpflow.records.summary import read_summary
from tasks.results.verdicts import read_verdict


def run_foreign_dag(deployment: Path, run_dir: Path) -> DagRunResult:
    """dag.test() of the run DAG on FOREIGN_RUN in `run_dir`, its jobs those of `deployment`."""
    return run_dag_test("mlperf_grpo_run", {**FOREIGN_RUN, "run_dir": str(run_dir)}, deployment)


def assert_decided_at_the_passing_step(run_dir: Path, ran: Sequence[int]) -> list[Event]:
    """The run's MLLOG has an eval_accuracy per evaluated step of `ran` (its samples_count the
    step's), the last the passing skill's 176/251, and run_stop ``success`` at the passing
    checkpoint's time; the compliance checker passed it. Returns the MLLOG's events."""
    layout = RunLayout(str(run_dir))
    events = read_events(layout.mllog(1))
    accuracies = [e for e in events if e.key == "eval_accuracy"]
    # FOREIGN_RUN's global batch size: 16
    assert [e.metadata["samples_count"] for e in accuracies] == [s * 16 for s in ran]
    assert accuracies[-1].value == pytest.approx(176 / 251)
    (stop,) = [e for e in events if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    assert stop.time_ms == load(layout.manifest).row(PASSING_STEP).timestamp_ms
    verdict = read_verdict(str(run_dir), "compliance_checker")
    assert verdict is not None and verdict.ok, verdict
    return events


def assert_nemo_outputs_imported(run_dir: Path, ran: Sequence[int]) -> dict[int, list[Event]]:
    """The NeMo-RL-shaped pair's outputs imported: a manifest row per step of the trainer's
    step_<N>/ tree (from the validation start to max_steps), and per evaluated step of `ran` a
    summary without attempt records, timed by the evaluator's own MLLOG. Returns each step's
    evaluator MLLOG events."""
    first, last = FOREIGN_RUN["val_start_at"], FOREIGN_RUN["max_steps"]
    layout = RunLayout(str(run_dir))
    manifest = load(layout.manifest)
    assert [r.step for r in manifest.rows] == list(range(first, last + 1))
    assert manifest.row(first).checkpoint_path == f"{run_dir}/checkpoints/step_{first}"
    evaluator_events = {}
    for step in ran:
        summary = read_summary(layout.summary(step))
        assert summary.attempt_records is False
        own = read_events(str(run_dir / "nemo_eval" / f"step_{step}" / "mllog.log"))
        start = next(e for e in own if e.key == "eval_start")
        assert summary.eval_start_ms == start.time_ms  # the evaluator's own eval times
        evaluator_events[step] = own
    return evaluator_events
