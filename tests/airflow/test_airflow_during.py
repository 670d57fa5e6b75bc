"""dag.test() of mlperf_grpo_run with ``eval_schedule = "during_training"``.

``dag.test()`` runs one task at a time in one process, so here training always runs to its end
before an evaluation can (a wait picked before training gives its place back and comes again):
these tests pin the verdict, the log and the failure paths of the during-training wiring. That
training stops early at the verdict, with waits deferred alongside it, is the scheduler's test
(test_airflow_scheduler_during.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow_harness import (
    CONVERGING_RUN,
    FAST_RUN,
    Recording,
    failures,
    launched_jobs,
    recording_python,
    run_dag_test,
    write_deployment,
)

from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from rcpflow.records.mllog import read_events
from tasks.results.verdicts import read_verdict

WAIT = "evaluation.checkpoint.wait"
EVALUATE = "evaluation.checkpoint.evaluate"
STOP = "evaluation.checkpoint.stop_if_decided"


def during(tmp_path: Path, python: Path | None = None) -> Path:
    """A during-training deployment whose jobs run with `python` (default: this interpreter)."""
    return write_deployment(
        tmp_path / "deployment.toml",
        python=None if python is None else str(python),
        eval_schedule="during_training",
        checkpoint_poll_seconds=0.5,
    )


def failing_python(folder: Path, step: int) -> tuple[Path, Path]:
    """Like `recording_python`, but the evaluation job of `step` fails (exit 3)."""
    return recording_python(
        folder,
        before_run=(
            f"if sys.argv[1:3] == ['-m', 'tpu_jobs.evaluate'] and '{step}' == sys.argv[-1]:\n"
            "    print('evaluation failed on purpose', file=sys.stderr)\n"
            "    sys.exit(3)\n"
        ),
    )


@pytest.mark.timeout(900)
def test_during_training_reaches_the_same_verdict_and_log(
    airflow_db: str, tmp_path: Path, run_dir: Path, recording: Recording
) -> None:
    conf = {**CONVERGING_RUN, "run_dir": str(run_dir)}

    result = run_dag_test("mlperf_grpo_run", conf, during(tmp_path, recording.python))

    assert result.state == "success", failures(result)
    first, last = CONVERGING_RUN["val_start_at"], CONVERGING_RUN["max_steps"]
    planned = list(range(first, last + 1))
    # mapped over the planned steps, labelled by step
    assert result.mapped_labels(WAIT) == [f"step {s}" for s in planned]
    layout = RunLayout(str(run_dir))
    events = read_events(layout.mllog(1))
    (stop,) = [e for e in events if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    passed = stop.metadata["samples_count"] // 256
    assert first < passed < last
    rows = {r.step: r for r in load(layout.manifest).rows}
    assert stop.time_ms == rows[passed].timestamp_ms
    logged = [e.metadata["samples_count"] // 256 for e in events if e.key == "eval_accuracy"]
    assert logged == list(range(first, passed + 1))
    # each step up to the passing one evaluated once by a real job; later ones skipped unless
    # dag.test's random order ran them first
    jobs = launched_jobs(recording.record)
    evaluated = [int(j.split("--step ")[1]) for j in jobs if j.split()[1] == "tpu_jobs.evaluate"]
    assert len(evaluated) == len(set(evaluated))
    assert set(range(first, passed + 1)) <= set(evaluated)
    states = dict(zip(planned, result.mapped(EVALUATE), strict=True))
    assert all(states[s] == "success" for s in range(first, passed + 1))
    assert all(states[s] in ("skipped", "success") for s in range(passed + 1, last + 1))
    # the verdict was decided, so the DAG asked for a stop (after training had ended here)
    request = json.loads(Path(layout.stop_request).read_text())
    assert request["step"] == passed and request["timestamp_ms"] == stop.time_ms
    verdict = read_verdict(str(run_dir), "compliance_checker")
    assert verdict is not None and verdict.ok, verdict


@pytest.mark.timeout(600)
def test_a_run_that_never_passes_trains_to_max_steps_and_aborts(
    airflow_db: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    conf = {**FAST_RUN, "run_dir": str(run_dir)}

    result = run_dag_test("mlperf_grpo_run", conf, during(tmp_path))

    layout = RunLayout(str(run_dir))
    rows = load(layout.manifest).rows
    assert [r.step for r in rows] == list(range(2, FAST_RUN["max_steps"] + 1))
    assert not Path(layout.stop_request).exists()
    assert result.mapped(EVALUATE) == ["success"] * len(rows)
    assert result.states[("evaluation.finalize", -1)] == "success"
    (stop,) = [e for e in read_events(layout.mllog(1)) if e.key == "run_stop"]
    assert stop.metadata["status"] == "aborted"
    assert stop.time_ms == rows[-1].timestamp_ms
    # as after training: the compliance checker does not accept an unconverged run
    assert result.states[("evaluation.check", -1)] == "failed"
    assert result.state == "failed"


@pytest.mark.timeout(600)
def test_a_failed_low_step_evaluation_fails_the_run_without_run_stop(
    airflow_db: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    python, record = failing_python(tmp_path, step=2)
    conf = {**FAST_RUN, "run_dir": str(run_dir)}

    result = run_dag_test("mlperf_grpo_run", conf, during(tmp_path, python))

    assert result.state == "failed"
    assert result.mapped(EVALUATE)[0] == "failed"
    assert result.mapped(STOP)[0] == "upstream_failed"
    assert result.states[("evaluation.finalize", -1)] == "upstream_failed"
    layout = RunLayout(str(run_dir))
    assert "run_stop" not in [e.key for e in read_events(layout.mllog(1))]
    # nothing was decided: no stop request, training ran to max_steps
    assert not Path(layout.stop_request).exists()
    assert [r.step for r in load(layout.manifest).rows] == list(range(2, 7))
    assert result.states[("train.check_outputs", -1)] == "success"
    assert any("--step 2" in j for j in launched_jobs(record))
