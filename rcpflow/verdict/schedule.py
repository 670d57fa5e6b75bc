"""When a run's checkpoints are evaluated, in the rules' words: the schedule vocabulary
(`EvalSchedule`) and what training_policies #596 says about each schedule, one home for the
deployment, the Params, the forecast, the run's record (`rcpflow.verdict.schedule_record`) and
the report.

``after_training`` (the default) evaluates once training has halted, the rules' own wording;
``during_training`` evaluates while training runs and stops training at the verdict, which the
rules do not describe.
"""

from __future__ import annotations

import typing
from typing import Literal

from rcpflow.recipe import Division

EvalSchedule = Literal["after_training", "during_training"]
SCHEDULES: tuple[EvalSchedule, ...] = typing.get_args(EvalSchedule)
DEFAULT_SCHEDULE: EvalSchedule = "after_training"

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
