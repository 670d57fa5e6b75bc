"""When a run's checkpoints are evaluated (the ``eval_schedule`` and ``eval_window`` Params),
what the rules say about each, and the record of what a run used.

Both schedules have one wiring (`tasks.run.planned`): a ``checkpoint`` group per planned step
whose ``wait`` lets its step go when the checkpoint can be evaluated and the run's window has
room. ``after_training`` (the default) lets every step go once training has halted;
``during_training`` as soon as its checkpoint is committed, and asks the trainer to stop at the
verdict. The plan writes ``<run_dir>/eval_schedule.json`` (`record_schedule`), so the report
and the RCP view can say which one a run used (`read_schedule`); the MLLOG is the same either
way.
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass

from rcpflow.files.layout import join
from rcpflow.files.storage import storage_for
from rcpflow.recipe import Division
from tasks.deployment import EvalSchedule

SCHEDULES: tuple[EvalSchedule, ...] = typing.get_args(EvalSchedule)
FILE_NAME = "eval_schedule.json"
FORMAT = "rcpflow.eval_schedule.v1"

# training_policies #596, quoted: the only evaluation timing the rules describe.
RULES_QUOTE = (
    "Once training halts, saved checkpoints may be evaluated offline in any order until the "
    "one that achieves target evaluation accuracy is found"
)
RULES_WORDING: dict[EvalSchedule, str] = {
    "after_training": (
        "after_training: the rules' own wording (training_policies #596: "
        f'"{RULES_QUOTE}"): training runs to max_steps, then the checkpoints are evaluated in '
        "any order, W at a time, and the log is written in step order."
    ),
    "during_training": (
        "during_training: not described by the rules (training_policies #596 describes "
        "evaluation once training halts): checkpoints are evaluated while training runs and "
        "training is stopped at the verdict. For the open division, or with the working "
        "group's agreement."
    ),
}


def described_by_rules(schedule: EvalSchedule) -> bool:
    return schedule == "after_training"


def closed_division_warning(schedule: EvalSchedule, division: Division) -> str | None:
    """The warning a closed-division result evaluated outside the rules' wording carries."""
    if division != "closed" or described_by_rules(schedule):
        return None
    return (
        f"WARNING: closed division with eval_schedule {schedule}: evaluating during training "
        "and stopping training at the verdict are not described by the rules (training_policies "
        "#596); submit such a result only with the working group's agreement."
    )


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


def schedule_path(run_dir: str) -> str:
    return join(run_dir, FILE_NAME)


def record_schedule(run_dir: str, record: ScheduleRecord) -> None:
    """Write the run's record (the same bytes on a retry)."""
    path = schedule_path(run_dir)
    storage_for(path).write_atomic(path, record.to_json())


def read_schedule(run_dir: str) -> ScheduleRecord | None:
    """The schedule the run in `run_dir` used; None for a run planned before this record
    existed (or not by the run DAG); ScheduleRecordError when the file is not one."""
    path = schedule_path(run_dir)
    storage = storage_for(path)
    if not storage.exists(path):
        return None
    return ScheduleRecord.from_json(storage.read_bytes(path), path)
