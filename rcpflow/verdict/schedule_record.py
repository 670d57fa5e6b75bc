"""The run's record of when its checkpoints were evaluated (the ``eval_schedule`` and
``eval_window`` Params): ``<run_dir>/eval_schedule.json``. The schedules themselves and what the
rules say about each are `rcpflow.verdict.schedule`'s.

Both schedules have one wiring (`tasks.run.evaluation_over_steps`): a ``checkpoint`` group per
planned step whose ``wait`` lets its step go when the checkpoint can be evaluated and the run's
window has room. ``after_training`` (the default) lets every step go once training has halted;
``during_training`` as soon as its checkpoint is committed, and asks the trainer to stop at the
verdict. The run DAG's plan writes the record (`record_schedule`), so the report and the RCP
view can say which one a run used (`read_schedule`); the MLLOG is the same either way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.verdict.schedule import RULES_WORDING, SCHEDULES, EvalSchedule, described_by_rules

# The file's format id: a literal that never follows a module move (it moved from
# tasks/run/schedules.py, and runs recorded before still read).
FORMAT = "rcpflow.eval_schedule.v1"


class ScheduleRecordError(ValueError):
    """An ``eval_schedule.json`` that this module did not write; the message names the field."""


@dataclass(frozen=True)
class ScheduleRecord:
    """What the run was asked to do about evaluation."""

    eval_schedule: EvalSchedule
    eval_window: int

    @property
    def described_by_rules(self) -> bool:
        return described_by_rules(self.eval_schedule)

    def statement(self) -> str:
        """One line for a report: the schedule, the window, what the rules say."""
        return f"{RULES_WORDING[self.eval_schedule]} Eval window W = {self.eval_window}."

    def to_json(self) -> bytes:
        d = {
            "format": FORMAT,
            "eval_schedule": self.eval_schedule,
            "eval_window": self.eval_window,
            "described_by_rules": self.described_by_rules,
        }
        return (json.dumps(d, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> ScheduleRecord:
        try:
            d = json.loads(data)
        except ValueError as exc:
            raise ScheduleRecordError(f"{where}: not JSON ({exc})") from exc
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ScheduleRecordError(f"{where}: format is not {FORMAT!r}")
        schedule, window = d.get("eval_schedule"), d.get("eval_window")
        if schedule not in SCHEDULES:
            raise ScheduleRecordError(
                f"{where}: eval_schedule {schedule!r} is not one of {SCHEDULES}"
            )
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ScheduleRecordError(f"{where}: eval_window {window!r} is not an integer >= 1")
        return cls(eval_schedule=schedule, eval_window=window)


def record_schedule(run_dir: str, record: ScheduleRecord) -> None:
    """Write the run's record (the same bytes on a retry)."""
    path = RunLayout(run_dir).eval_schedule
    storage_for(path).write_atomic(path, record.to_json())


def read_schedule(run_dir: str) -> ScheduleRecord | None:
    """The schedule the run in `run_dir` used; None for a run planned before this record
    existed (or not by the run DAG); ScheduleRecordError when the file is not one."""
    path = RunLayout(run_dir).eval_schedule
    storage = storage_for(path)
    if not storage.exists(path):
        return None
    return ScheduleRecord.from_json(storage.read_bytes(path), path)
