"""An evaluate task ended on the triggerer (`tasks.run.evaluation_end`): a summary collected and
checked into the task's XCom, a pass stopping the higher steps' evaluations (never a lower
one), an invalid summary or a failed job failing the task, a failure after a lower pass
skipped as moot, a changed manifest row refused, and retention while training applied."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fake_driver
import pytest

from devtools.synthetic_run import SyntheticRun, make_run, rows_of, write_eval
from rcpflow.files.layout import RunLayout
from tasks.backend_api import protocol
from tasks.backend_api.lifecycle_names import JOB_RECORD_KEY
from tasks.backend_api.task_end import JobOutcome, TaskEnd, TaskEndSpec, end_task
from tasks.deployment import RetentionSettings
from tasks.jobs.templates import TrainResult
from tasks.run.evaluation_end import evaluation_end_args

REF = {"name": "evaluate step 19", "pid": 1}
OK = JobOutcome(REF, "succeeded", "evaluate step 19: finished")
FAILED = JobOutcome(REF, "failed", "evaluate step 19 exited with status 1")


# The steps whose evaluation an end stopped (the DAG run, the step), through the driver it
# named ("recording", rebuilt from its JSON args on the triggerer).
CANCELLED: list[tuple[tuple[str, str], int]] = []


class _Recording(fake_driver.FakeDriver):
    name = "recording"

    def cancel_step(self, dag_id: str, run_id: str, run_dir: str, step: int) -> bool:
        CANCELLED.append(((dag_id, run_id), step))
        return True


@pytest.fixture
def cancelled(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[str, str], int]]:
    monkeypatch.setitem(protocol._DRIVERS, "recording", _Recording)  # type: ignore[arg-type]
    CANCELLED.clear()
    return CANCELLED


def _args(run: SyntheticRun, step: int, *, planned: bool = False, **kw: Any) -> dict[str, Any]:
    rows = {r.step: dataclasses.asdict(r) for r in rows_of(run.run_dir)}
    row = None if planned else rows[step]
    kw.setdefault("retention", None)
    return evaluation_end_args(
        REF, run.run_dir, row=row, step=step, cancel=("recording", {"restarts": 0}, "d", "r"), **kw
    )


def _end(args: Mapping[str, Any], outcome: JobOutcome = OK) -> TaskEnd:
    end = end_task(TaskEndSpec("evaluation", args), outcome)
    assert end is not None
    return end


def test_a_pass_collects_the_summary_and_stops_only_the_higher_steps(
    tmp_path: Path, cancelled: list[tuple[tuple[str, str], int]]
) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=22, accuracies={18: 0.5, 19: 0.8})
    end = _end(_args(run, 19))
    assert end.state == "success", end.line
    result = end.xcoms["return_value"]
    assert result["target_reached"] is True and result["step"] == 19
    assert end.xcoms[JOB_RECORD_KEY] == {**REF, "cancel": True, "why": "succeeded"}
    assert cancelled == [(("d", "r"), 20), (("d", "r"), 21), (("d", "r"), 22)]


def test_a_step_below_the_target_stops_nothing(
    tmp_path: Path, cancelled: list[tuple[tuple[str, str], int]]
) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=22, accuracies={18: 0.5})
    end = _end(_args(run, 18, planned=True))
    assert end.state == "success" and end.xcoms["return_value"]["target_reached"] is False
    assert cancelled == []


def test_an_invalid_or_missing_summary_fails_the_task_naming_it(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=22, accuracies={18: 0.5})
    missing = _end(_args(run, 19))
    assert missing.state == "failed" and "step 19: the job wrote no summary" in missing.line
    write_eval(run, 19, 0.8)
    summary = Path(RunLayout(run.run_dir).summary(19))
    summary.write_text(summary.read_text().replace('"complete": true', '"complete": false'))
    invalid = _end(_args(run, 19))
    assert invalid.state == "failed" and "step 19: summary" in invalid.line


def test_a_failed_job_fails_the_task_unless_a_lower_step_passed(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=22, accuracies={18: 0.5})
    failed = _end(_args(run, 20), FAILED)
    assert failed.state == "failed" and failed.line == FAILED.line
    write_eval(run, 19, 0.8)
    moot = _end(_args(run, 20), FAILED)
    assert moot.state == "skipped" and "19" in moot.line
    assert moot.xcoms[JOB_RECORD_KEY]["cancel"] is True


def test_an_outcome_for_a_worker_resumes_the_task_unless_a_lower_step_passed(
    tmp_path: Path,
) -> None:
    """A Slurm job to restart or a Failed JobSet is the backend's to decide on a worker; once a
    lower step passed, it is moot and the task ends skipped on the triggerer."""
    run = make_run(str(tmp_path / "run"), max_steps=22, accuracies={18: 0.5})
    other = JobOutcome(REF, "other", "Slurm job 7 ended: TIMEOUT")
    assert end_task(TaskEndSpec("evaluation", _args(run, 20)), other) is None
    write_eval(run, 19, 0.8)
    assert _end(_args(run, 20), other).state == "skipped"


def test_a_manifest_row_changed_since_it_was_loaded_fails_the_task(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=22, accuracies={19: 0.8})
    args = _args(run, 19)
    args["row"] = {**args["row"], "timestamp_ms": args["row"]["timestamp_ms"] + 1}
    end = _end(args)
    assert end.state == "failed" and "manifest row changed" in end.line


def test_retention_while_training_deletes_what_the_collected_result_lets_go(
    tmp_path: Path,
) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=22, accuracies={18: 0.5})
    for step in (18, 19):
        folder = Path(run.layout.checkpoint(step))
        folder.mkdir(parents=True)
        (folder / "weights").write_bytes(b"w")
    retention = {
        "seed": run.seed,
        "choice": "passing",
        "settings": dataclasses.asdict(RetentionSettings("passing", while_training=True)),
        "train_result": dataclasses.asdict(TrainResult()),
    }
    json.dumps(retention)  # a trigger's kwargs carry it
    end = _end(_args(run, 18, planned=True, retention=retention))
    assert end.state == "success", end.line
    assert not Path(run.layout.checkpoint(18)).exists()
    assert Path(run.layout.checkpoint(19)).exists()
    assert Path(RunLayout(run.run_dir).manifest).exists()
