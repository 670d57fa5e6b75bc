"""The submission report says which evaluation schedule each run used and what the rules say
about it; a closed-division submission evaluated during training carries a visible warning
(the report is still written and judged by the checkers alone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.synthetic_run import make_run
from rcpflow.verdict.finalize import finalize
from rcpflow.verdict.schedule_record import ScheduleRecord, read_schedule, record_schedule
from tasks.submission.report import render_report
from tasks.submission.spec import SubmissionSpec

WARNING = "WARNING: closed division with eval_schedule during_training"


def submission(tmp_path: Path, division: str, schedules: dict[int, str | None]) -> SubmissionSpec:
    spec = SubmissionSpec(
        name="s", out_dir=str(tmp_path / "s"), seeds=(1, 2, 3), global_batch_size=256,
        max_steps=24, val_start_at=None, target=0.69, division=division,  # type: ignore[arg-type]
        backend="local", system={},
    )  # fmt: skip
    for seed, schedule in schedules.items():
        make_run(spec.run_dir(seed), seed=seed, division=division, accuracies={18: 0.8})
        finalize(spec.run_dir(seed))
        if schedule is not None:
            record_schedule(spec.run_dir(seed), ScheduleRecord(schedule, 3))  # type: ignore[arg-type]
    return spec


def test_after_training_is_stated_as_the_rules_wording(tmp_path: Path) -> None:
    spec = submission(tmp_path, "closed", {1: "after_training", 2: "after_training", 3: None})
    text, _ = render_report(spec)
    assert "## Evaluation schedule" in text
    assert "- seed(s) 1, 2: after_training: the rules' own wording" in text
    assert '"Once training halts, saved checkpoints may be evaluated offline in any order' in text
    assert "- seed(s) 3: no schedule recorded in the run folder" in text
    assert "| after_training, W=3 |" in text and "| not recorded |" in text
    assert "WARNING" not in text


@pytest.mark.parametrize(("division", "warned"), [("closed", True), ("open", False)])
def test_during_training_is_marked_and_warned_in_the_closed_division(
    tmp_path: Path, division: str, warned: bool
) -> None:
    schedules: dict[int, str | None] = {
        1: "during_training",
        2: "after_training",
        3: "during_training",
    }
    text, _ = render_report(submission(tmp_path, division, schedules))
    assert "- seed(s) 1, 3: during_training: not described by the rules" in text
    assert "For the open division, or with the working group's agreement." in text
    assert (WARNING in text) is warned
    if warned:  # visible: a bold quote right under the heading, before the runs
        assert text.index(f"> **{WARNING}") < text.index("## Runs")


def test_the_record_is_what_the_plan_wrote(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    assert read_schedule(run_dir) is None
    record = ScheduleRecord("during_training", 10)
    record_schedule(run_dir, record)
    first = (tmp_path / "run" / "eval_schedule.json").read_bytes()
    record_schedule(run_dir, record)  # a retry gives the same bytes
    assert (tmp_path / "run" / "eval_schedule.json").read_bytes() == first
    assert read_schedule(run_dir) == record
    assert not record.described_by_rules
