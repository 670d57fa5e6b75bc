"""Eval summaries: counting, validity against a manifest row, and strict reading."""

import json

import pytest
from synthetic_run import attempts_for_accuracy, make_run

from rcpflow import recipe
from rcpflow.summary import (
    AttemptResult,
    EvalSummary,
    SummaryError,
    build_summary,
    read_summary,
    summary_problems,
    write_summary,
)


def _build(attempts, **kw):
    args = dict(
        attempts_per_instance=4,
        checkpoint_step=18,
        checkpoint_timestamp_ms=5,
        samples_count=18 * 256,
        target_accuracy=0.69,
        eval_start_ms=10,
        eval_stop_ms=20,
    )
    args.update(kw)
    return build_summary(attempts, **args)


def test_counts_and_pass_at_k():
    s = _build(attempts_for_accuracy(0.7))
    assert s.instances == 251 and s.expected_attempts == 1004
    assert s.resolved_attempts == 176 and s.completed_attempts == 1004
    assert s.eval_accuracy == pytest.approx(176 / 251)
    assert s.pass_at_k["1"] == pytest.approx(176 / 251 / 4)
    assert s.complete and s.target_reached


def test_missing_and_errors_count_as_failures():
    attempts = attempts_for_accuracy(1.0)
    attempts[0] = [AttemptResult("error")] * 4  # instance 0: every attempt errored
    attempts = attempts[:-1]  # the last instance never ran
    s = _build(attempts)
    assert s.missing_attempts == 4 and s.error_attempts == 4
    assert not s.complete and not s.target_reached
    assert s.eval_accuracy == pytest.approx(249 / 251)
    assert s.status_counts == {"resolved": 249, "failed": 747, "error": 4, "missing": 4}


def test_validity_against_row(tmp_path):
    run = make_run(str(tmp_path), accuracies={})
    row = run.row(18)
    good = _build(attempts_for_accuracy(0.5), checkpoint_timestamp_ms=row.timestamp_ms)
    assert summary_problems(good, row) == []
    other = _build(attempts_for_accuracy(0.5), checkpoint_timestamp_ms=row.timestamp_ms + 1)
    assert any("checkpoint_timestamp_ms" in p for p in summary_problems(other, row))
    fatal = _build(
        attempts_for_accuracy(0.9),
        checkpoint_timestamp_ms=row.timestamp_ms,
        fatal_error="weights fingerprint mismatch",
    )
    assert any("fatal" in p for p in summary_problems(fatal, row))
    errored = _build([[AttemptResult("error")] * 4] * 251, checkpoint_timestamp_ms=row.timestamp_ms)
    assert any("errored" in p for p in summary_problems(errored, row))


def test_round_trip_and_strict_read(tmp_path):
    s = _build(attempts_for_accuracy(0.3))
    path = str(tmp_path / "summary.json")
    write_summary(path, s)
    assert read_summary(path) == s
    d = json.loads(s.to_json())
    del d["complete"]
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(SummaryError, match=r"missing field.*complete"):
        read_summary(str(tmp_path / "bad.json"))
    d = json.loads(s.to_json())
    d["pass_at_k"]["4"] = 1.5
    with pytest.raises(SummaryError, match="pass_at_k"):
        EvalSummary.from_json(json.dumps(d), where="x")
    with pytest.raises(SummaryError, match="not JSON"):
        EvalSummary.from_json("{", where="x")


def test_needs_four_attempts():
    with pytest.raises(ValueError, match="attempts_per_instance"):
        _build(attempts_for_accuracy(0.5), attempts_per_instance=recipe.PASS_K - 1)


def test_gate_is_strict_at_the_target(tmp_path):
    import dataclasses

    from rcpflow.gate import passes

    run = make_run(str(tmp_path), max_steps=18)
    s = _build(attempts_for_accuracy(0.5), checkpoint_timestamp_ms=run.row(18).timestamp_ms)
    at_target = dataclasses.replace(s, pass_at_k={"1": 0.2, "4": 0.69})
    above = dataclasses.replace(s, pass_at_k={"1": 0.2, "4": 0.6900001})
    assert not passes(at_target, run.row(18))
    assert passes(above, run.row(18))
