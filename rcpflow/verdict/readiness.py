"""May the checkpoint of step N be evaluated now? One answer, from one snapshot of the run: go
now, wait, or skip (with the sentence the task logs). The waits of deferred evaluation
(`tasks.run.triggers`, on the triggerer) and their operator (`tasks.run.checkpoint_wait`, on a
worker) read the snapshot and call `readiness`; neither holds a rule of its own (docs/run-folder.md,
"The wait").

The rules, in order:
- a lower step's valid summary already passes the target: skip, the run is decided
  (`rcpflow.verdict.gate`);
- training ended (``block_stop``) without the step's row: skip, it never comes;
- the row is committed and the schedule lets it go: ``during_training`` at once,
  ``after_training`` once training has halted (its ``block_stop``, or the train group's success);
- otherwise the answer needs the orchestrator's view of training (`Readiness.needs_training`):
  failed: skip; finished without the row: skip; else wait.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from rcpflow.records.checkpoint_state import RunSnapshot
from rcpflow.records.manifest import ManifestRow
from rcpflow.verdict.schedule import EvalSchedule

Decision = Literal["go", "wait", "skip"]
# Why: committed (go), pending (wait), decided / ended / training_failed (skip).
Reason = Literal["committed", "pending", "decided", "ended", "training_failed"]
SkipReason = Literal["decided", "ended", "training_failed"]
# The train group's progress as the orchestrator sees it (None: not read).
TrainingState = Literal["not_started", "running", "succeeded", "failed"]


def skip_sentence(
    step: int,
    reason: SkipReason,
    *,
    stopped: bool = False,
    passed: int | None = None,
    target_accuracy: float | None = None,
    detail: str | None = None,
    train_group: str | None = None,
) -> str:
    """Why `step`'s evaluation is skipped, in the one sentence every skip logs first (the waits
    on the triggerer, their operator and the evaluate task all say it this way).

    ``decided``: step `passed` already passed (`target_accuracy`, when known, is named;
    `stopped`: the step's job was running and was stopped after that pass); ``ended``: training
    stopped without the step (`detail` says how); ``training_failed``: the train group (by its
    id, `train_group`, when known) failed."""
    if reason == "decided":
        what = "its evaluation was stopped" if stopped else "not evaluated"
        above = (
            "" if target_accuracy is None else f" (its valid summary is above {target_accuracy})"
        )
        return (
            f"step {step}: skipped, {what}: step {passed} already passed the target{above}, "
            "which decided the run"
        )
    if reason == "training_failed":
        who = "training" if train_group is None else f"the {train_group} group"
        return f"step {step}: skipped: {who} failed"
    return f"step {step}: skipped: {detail}"


# The answer: go, wait or skip, why, the sentence the task logs (a skip's reason is the first
# line of its log), the row when it goes, and whether the train group's state may change it.
class Readiness(NamedTuple):
    decision: Decision
    reason: Reason
    sentence: str
    row: ManifestRow | None = None
    needs_training: bool = False


def readiness(
    step: int,
    snapshot: RunSnapshot,
    passed: int | None,
    schedule: EvalSchedule,
    training: TrainingState | None = None,
) -> Readiness:
    """Whether `step` goes now, waits or is skipped, from `snapshot` (the run's rows and
    block_stop), `passed` (the lowest step whose valid summary passes, `gate.lowest_passing`),
    `schedule` and, when known, `training` (the train group's state)."""
    if passed is not None and passed < step:
        return Readiness("skip", "decided", skip_sentence(step, "decided", passed=passed))
    progress = snapshot.progress(step)
    if progress.state == "ended":
        return Readiness("skip", "ended", skip_sentence(step, "ended", detail=progress.detail))
    halted = snapshot.ended_at is not None or training == "succeeded"
    if progress.state == "committed" and (schedule == "during_training" or halted):
        return Readiness("go", "committed", progress.detail, progress.row)
    if training is None:
        return Readiness("wait", "pending", progress.detail, needs_training=True)
    if training == "failed":
        return Readiness("skip", "training_failed", skip_sentence(step, "training_failed"))
    if training == "succeeded":  # and the step has no row
        detail = f"training finished without a checkpoint of step {step}"
        return Readiness("skip", "ended", skip_sentence(step, "ended", detail=detail))
    return Readiness("wait", "pending", progress.detail)
