"""The retention rule: which of a run's checkpoints the verdict can still need, and why.

Pure: it decides from facts the caller read (`rcpflow.retention.apply` reads them from the
run folder). One decision per checkpoint, kept or gone, with one named reason. A checkpoint may go
when no verdict can need it any more: its valid summary is persisted and below the target, or it
lies above the run's passing step once the verdict is decided, and the policy does not keep it;
while training runs only with the policy's `while_training` (a resume needs them otherwise), and
never the newest full state then.
A full-state save's ``train_state/`` may go once training has ended or a newer full state exists
(its weights stay while a rule keeps them). Never gone: a checkpoint without a persisted valid
summary ("no summary" is read as "maybe being evaluated", unless the caller says the run's
evaluations are settled and it lies above the passing step; an invalid one awaits
re-evaluation), one being evaluated (its evaluator's record, `rcpflow.records.evaluating`, is
there: whatever else is known, settled included), one the caller protects (the MLLOG's
run_stop, a package, a pending re-evaluation), or one outside the run's checkpoint tree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from rcpflow.files.layout import CHECKPOINT_STATE_DIR, join

Keep = Literal["passing", "last-k", "nothing"]
KEEPS: tuple[Keep, ...] = ("passing", "last-k", "nothing")
# What the persisted summary says: none, not usable (re-evaluation pending), or its verdict.
Evaluation = Literal["missing", "unusable", "below", "passes"]
Part = Literal["checkpoint", "train_state"]


@dataclass(frozen=True)
class RetentionPolicy:
    """What is kept beyond what the verdict needs: the passing checkpoint (default), the last
    `last_k` evaluated ones, or nothing (the passing one may go too)."""

    keep: Keep = "passing"
    last_k: int = 1
    # Delete evaluated checkpoints before training has ended. Off by default: rcpflow's trainer
    # (tpu_jobs) refuses to resume when a manifest row's checkpoint is gone, so only a trainer
    # whose resume tolerates it may have them deleted while it runs.
    while_training: bool = False

    def __post_init__(self) -> None:
        if self.keep not in KEEPS:
            raise ValueError(f"retention keep {self.keep!r}: give one of {', '.join(KEEPS)}")
        if self.last_k < 0:
            raise ValueError(f"retention last_k {self.last_k}: must be 0 or more")


DEFAULT_POLICY = RetentionPolicy()


@dataclass(frozen=True)
class CheckpointFacts:
    """One manifest row's checkpoint as read: where it is, whether it is inside the run's
    checkpoint tree (a symlink is not), its evaluation, whether it holds a full state."""

    step: int
    path: str
    inside_tree: bool
    present: bool
    evaluation: Evaluation
    full_state: bool = False
    # Its evaluator's record (`rcpflow.records.evaluating.running`): being evaluated now.
    evaluating: str | None = None
    # Why an "unusable" summary does not decide it (a summary of another checkpoint: its step
    # or weight-update time is not the row's), as `rcpflow.verdict.verify` says it.
    unusable_why: str = ""


@dataclass(frozen=True)
class RunFacts:
    checkpoints: tuple[CheckpointFacts, ...]  # by step
    passing_step: int | None  # the verdict is decided: success at this step
    verdict_decided: bool  # success or aborted, from the persisted summaries
    training_ended: bool
    # Steps something else still references, and what (the MLLOG's run_stop, a package, ...).
    protected: Mapping[int, str] = field(default_factory=dict)
    # The caller knows no evaluation of the run is running or will start (the run DAG once it
    # has cancelled those above the passing step; a person with --settled): then a checkpoint
    # above the passing step without a summary may go too.
    settled: bool = False


@dataclass(frozen=True)
class Decision:
    """Whether `part` of step `step`'s checkpoint at `path` goes, and why."""

    step: int
    part: Part
    path: str
    goes: bool
    reason: str


def _newest_full(facts: RunFacts) -> int | None:
    return max((c.step for c in facts.checkpoints if c.full_state), default=None)


def _evaluated_kept(facts: RunFacts, policy: RetentionPolicy) -> set[int]:
    """The evaluated steps the policy keeps."""
    if policy.keep == "passing":
        return set() if facts.passing_step is None else {facts.passing_step}
    if policy.keep == "last-k":
        evaluated = sorted(c.step for c in facts.checkpoints if c.evaluation in ("below", "passes"))
        return set(evaluated[len(evaluated) - policy.last_k :]) if policy.last_k else set()
    return set()


def _whole(c: CheckpointFacts, facts: RunFacts, policy: RetentionPolicy) -> tuple[bool, str]:
    """Whether the whole checkpoint goes, and why."""
    if not c.inside_tree:
        return False, "outside the run's checkpoint tree (never deleted)"
    if not c.present:
        return False, "not present"
    if c.step in facts.protected:
        return False, f"referenced by {facts.protected[c.step]}"
    if c.evaluating is not None:
        return False, f"being evaluated ({c.evaluating})"
    passing = facts.passing_step
    if c.evaluation == "missing":
        if passing is not None and c.step > passing and facts.settled and facts.training_ended:
            return True, f"above the passing step {passing}, not evaluated: the verdict is decided"
        return False, "no persisted summary (maybe being evaluated)"
    if c.evaluation == "unusable":
        why = f": {c.unusable_why}" if c.unusable_why else ""
        return False, f"summary not valid{why} (re-evaluation pending)"
    if not facts.training_ended:
        if not policy.while_training:
            return False, "training has not ended (a resume needs every row's checkpoint)"
        if c.full_state and c.step == _newest_full(facts):
            return False, "the newest full state (a resume needs it)"
    kept = _evaluated_kept(facts, policy)
    if c.step in kept:
        what = "the passing checkpoint" if c.step == facts.passing_step else "evaluated"
        return False, f"{what}, kept by the policy (keep {policy.keep})"
    if passing is not None and c.step > passing:
        return True, f"above the passing step {passing}: the verdict is decided"
    if c.evaluation == "below":
        return True, "evaluated below the target"
    if c.step == passing:
        return True, f"the passing checkpoint, not kept by the policy (keep {policy.keep})"
    return False, "passes the target; the verdict is not decided yet"


def decide(facts: RunFacts, policy: RetentionPolicy = DEFAULT_POLICY) -> tuple[Decision, ...]:
    """One decision per checkpoint (and one per full state's ``train_state/`` the checkpoint
    keeps), by step."""
    out: list[Decision] = []
    newest_full = _newest_full(facts)
    for c in sorted(facts.checkpoints, key=lambda c: c.step):
        goes, reason = _whole(c, facts, policy)
        out.append(Decision(c.step, "checkpoint", c.path, goes, reason))
        if goes or not c.full_state or not c.inside_tree or not c.present or c.evaluating:
            continue
        state = join(c.path, CHECKPOINT_STATE_DIR)
        if facts.training_ended:
            out.append(Decision(c.step, "train_state", state, True, "full state: training ended"))
        elif newest_full is not None and newest_full > c.step:
            why = f"full state: a newer one exists (step {newest_full})"
            out.append(Decision(c.step, "train_state", state, True, why))
        else:
            why = "the newest full state (a resume needs it)"
            out.append(Decision(c.step, "train_state", state, False, why))
    return tuple(out)
