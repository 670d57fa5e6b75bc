"""The one answer to "step N: go now, wait or skip?" (rcpflow.verdict.readiness), from one
snapshot of a run: every rule, each schedule."""

from __future__ import annotations

import pytest

from devtools.synthetic_run import make_run, rows_of
from rcpflow.records.checkpoint_state import RunSnapshot
from rcpflow.verdict.readiness import readiness, skip_sentence


@pytest.fixture
def rows(tmp_path):
    return rows_of(make_run(str(tmp_path), max_steps=24, last_step=20).run_dir)


def test_a_lower_pass_skips_whatever_else(rows) -> None:
    running = RunSnapshot(rows, None)
    answer = readiness(19, running, 18, "during_training")
    assert (answer.decision, answer.reason) == ("skip", "decided")
    assert "step 18 already passed the target" in answer.sentence
    assert readiness(18, running, 18, "during_training").decision == "go"  # not below


@pytest.mark.parametrize(
    ("schedule", "ended_at", "training", "decision", "reason"),
    [
        ("during_training", None, None, "go", "committed"),
        ("after_training", None, None, "wait", "pending"),  # asks for training's state
        ("after_training", None, "running", "wait", "pending"),
        ("after_training", None, "succeeded", "go", "committed"),
        ("after_training", 20, None, "go", "committed"),  # block_stop: training halted
        ("after_training", None, "failed", "skip", "training_failed"),
    ],
)
def test_a_committed_step(rows, schedule, ended_at, training, decision, reason) -> None:
    answer = readiness(19, RunSnapshot(rows, ended_at), None, schedule, training)
    assert (answer.decision, answer.reason) == (decision, reason)
    assert (answer.row is not None) == (decision == "go")
    assert answer.needs_training == (decision == "wait" and training is None)


def test_a_step_without_a_row(rows) -> None:
    assert readiness(22, RunSnapshot(rows, 20), None, "during_training").reason == "ended"
    waiting = readiness(22, RunSnapshot(rows, None), None, "during_training")
    assert (waiting.decision, waiting.needs_training) == ("wait", True)
    finished = readiness(22, RunSnapshot(rows, None), None, "during_training", "succeeded")
    assert finished.decision == "skip"
    assert "training finished without a checkpoint of step 22" in finished.sentence


@pytest.mark.parametrize(
    ("kwargs", "sentence"),
    [
        (
            {"reason": "decided", "passed": 18},
            "step 19: skipped, not evaluated: step 18 already passed the target, which decided "
            "the run",
        ),
        (
            {"reason": "decided", "passed": 18, "target_accuracy": 0.69, "stopped": True},
            "step 19: skipped, its evaluation was stopped: step 18 already passed the target "
            "(its valid summary is above 0.69), which decided the run",
        ),
        (
            {"reason": "ended", "detail": "training finished without a checkpoint of step 19"},
            "step 19: skipped: training finished without a checkpoint of step 19",
        ),
        ({"reason": "training_failed"}, "step 19: skipped: training failed"),
        (
            {"reason": "training_failed", "train_group": "train"},
            "step 19: skipped: the train group failed",
        ),
    ],
)
def test_the_skip_sentence_has_one_author(kwargs, sentence) -> None:
    """The waits, their operator and the evaluate task log these words (tests of the run DAG
    match their beginnings)."""
    assert skip_sentence(19, **kwargs) == sentence


def test_readiness_says_the_skip_in_the_same_words(rows) -> None:
    answer = readiness(19, RunSnapshot(rows, None), None, "after_training", "failed")
    assert answer.sentence == skip_sentence(19, "training_failed")
