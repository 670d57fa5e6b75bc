"""The retention rule, one test per rule and per refusal (pure: facts in, decisions out)."""

from __future__ import annotations

import pytest

from rcpflow.retention.rule import (
    DEFAULT_POLICY,
    CheckpointFacts,
    RetentionPolicy,
    RunFacts,
    decide,
)


def ckpt(step: int, evaluation: str = "below", **kw: object) -> CheckpointFacts:
    base: dict[str, object] = dict(
        path=f"/run/checkpoints/{step}", inside_tree=True, present=True, evaluation=evaluation
    )
    return CheckpointFacts(step, **{**base, **kw})  # type: ignore[arg-type]


def whole(facts: RunFacts, policy: RetentionPolicy = DEFAULT_POLICY) -> dict[int, tuple[bool, str]]:
    return {d.step: (d.goes, d.reason) for d in decide(facts, policy) if d.part == "checkpoint"}


def test_below_the_target_goes_the_passing_one_stays_and_above_it_goes() -> None:
    facts = RunFacts((ckpt(18), ckpt(19, "passes"), ckpt(20, "passes")), 19, True, True)
    got = whole(facts)
    assert got[18] == (True, "evaluated below the target")
    assert got[19][0] is False and "passing checkpoint" in got[19][1]
    assert got[20] == (True, "above the passing step 19: the verdict is decided")


def test_an_unpersisted_summary_is_kept_even_above_the_passing_step() -> None:
    facts = RunFacts((ckpt(18, "passes"), ckpt(19, "missing")), 18, True, False)
    assert whole(facts)[19] == (False, "no persisted summary (maybe being evaluated)")


def test_an_invalid_summary_awaits_re_evaluation_and_is_kept() -> None:
    facts = RunFacts((ckpt(18, "unusable"),), None, False, False)
    assert whole(facts)[18] == (False, "summary not valid (re-evaluation pending)")


def test_outside_the_tree_is_never_deleted() -> None:
    facts = RunFacts((ckpt(18, inside_tree=False),), None, False, True)
    assert whole(facts)[18] == (False, "outside the run's checkpoint tree (never deleted)")


def test_a_protected_step_is_kept() -> None:
    facts = RunFacts((ckpt(18),), None, False, False, {18: "the package"})
    assert whole(facts)[18] == (False, "referenced by the package")


def test_before_the_verdict_nothing_above_an_undecided_step_goes() -> None:
    facts = RunFacts((ckpt(18, "missing"), ckpt(19, "passes")), None, False, True)
    assert whole(facts)[19] == (False, "passes the target; the verdict is not decided yet")


def test_keep_last_k_and_keep_nothing() -> None:
    rows = (ckpt(18), ckpt(19), ckpt(20, "passes"))
    facts = RunFacts(rows, 20, True, True)
    got = whole(facts, RetentionPolicy("last-k", 2))
    assert (got[18][0], got[19][0], got[20][0]) == (True, False, False)
    got = whole(facts, RetentionPolicy("nothing"))
    assert all(goes for goes, _ in got.values())


def test_full_state_goes_after_training_or_when_a_newer_one_exists() -> None:
    rows = (ckpt(18, "missing", full_state=True), ckpt(19, "missing", full_state=True))
    parts = {(d.step, d.part): d for d in decide(RunFacts(rows, None, False, False))}
    assert (
        parts[(18, "train_state")].goes
        and "newer one exists (step 19)" in parts[(18, "train_state")].reason
    )
    assert not parts[(19, "train_state")].goes  # the newest: a resume needs it
    assert parts[(19, "train_state")].path == "/run/checkpoints/19/train_state"
    parts = {(d.step, d.part): d for d in decide(RunFacts(rows, None, False, True))}
    assert parts[(19, "train_state")].goes
    assert not parts[(19, "checkpoint")].goes  # its weights still await evaluation


@pytest.mark.parametrize("bad", [dict(keep="all"), dict(keep="last-k", last_k=-1)])
def test_a_bad_policy_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="retention"):
        RetentionPolicy(**bad)  # type: ignore[arg-type]


def test_while_training_nothing_goes_unless_the_policy_says_so() -> None:
    rows = (ckpt(18, full_state=True), ckpt(19, full_state=True), ckpt(20, full_state=True))
    facts = RunFacts((*rows, ckpt(21, "missing")), None, False, False)
    got = whole(facts)
    assert got[18] == (False, "training has not ended (a resume needs every row's checkpoint)")
    got = whole(facts, RetentionPolicy(while_training=True))
    assert got[18][0] and got[19][0]
    assert got[20] == (False, "the newest full state (a resume needs it)")


def test_a_full_state_train_state_goes_with_its_checkpoint_not_twice() -> None:
    facts = RunFacts((ckpt(18, full_state=True),), None, True, True)
    assert [(d.part, d.goes) for d in decide(facts)] == [("checkpoint", True)]


def test_settled_lets_an_unevaluated_checkpoint_above_the_passing_step_go() -> None:
    rows = (ckpt(17, "missing"), ckpt(18, "passes"), ckpt(19, "missing"))
    facts = RunFacts(rows, 18, True, True, settled=True)
    got = whole(facts)
    assert got[19] == (True, "above the passing step 18, not evaluated: the verdict is decided")
    assert got[17][0] is False  # below the passing step: a summary is still missing
    assert whole(RunFacts(rows, 18, True, False, settled=True))[19][0] is False  # training runs


def test_a_checkpoint_being_evaluated_is_kept_whole_whatever_else_is_known() -> None:
    now = "eval/step_N/evaluating.json: pid 7 on h since 2026-12-01 00:00:00 UTC"
    rows = (
        ckpt(17, "below", evaluating=now, full_state=True),  # a re-evaluation of a decided one
        ckpt(18, "passes"),
        ckpt(19, "missing", evaluating=now),  # settled says none runs; its record says one does
        ckpt(20, "missing"),
    )
    decisions = decide(RunFacts(rows, 18, True, True, settled=True), RetentionPolicy("nothing"))
    got = {(d.step, d.part): (d.goes, d.reason) for d in decisions}
    assert got[(17, "checkpoint")] == (False, f"being evaluated ({now})")
    assert (17, "train_state") not in got  # nothing of it goes, not even its training state
    assert got[(19, "checkpoint")] == (False, f"being evaluated ({now})")
    assert got[(18, "checkpoint")][0] and got[(20, "checkpoint")][0]  # the same run, no record
