"""Eval summaries: Tunix's format, counting, and verification against itself, the benchmark and
the manifest row (every validity rule, also as a property)."""

import dataclasses
import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.synthetic_run import attempts_for_accuracy, make_run
from rcpflow import recipe
from rcpflow.records.manifest import ManifestRow
from rcpflow.records.summary import (
    AttemptResult,
    EvalSummary,
    SummaryError,
    build_summary,
    read_summary,
    write_summary,
)
from rcpflow.records.summary_checks import (
    consistency_problems,
    recomputed_problems,
    validity_problems,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "tunix"
TIMES = (1790661000000, 1790662697760)
T0 = 1_700_000_000_000  # eval and checkpoint times must be real ones (2020 .. now + 1 day)


def _build(attempts, **kw):
    args = dict(
        attempts_per_instance=4,
        checkpoint=_row(),  # step 18 at T0 + 5, 18 x 256 samples
        target_accuracy=0.69,
        eval_start_ms=T0 + 10,
        eval_stop_ms=T0 + 20,
    )
    args.update(kw)
    return build_summary(attempts, **args)


def _row(step=18, timestamp_ms=T0 + 5, gbs=256) -> ManifestRow:
    return ManifestRow(
        step=step,
        checkpoint_path="../checkpoints/18",
        timestamp_ms=timestamp_ms,
        samples_count=step * gbs,
        global_batch_size=gbs,
        batch_size=gbs // 16,
        num_generations=16,
        val_start_at=step,
        max_steps=step + 5,
        target_accuracy=0.69,
        seed=1,
        mllog_file="seed_1.out",
    )


def _tunix_row(step: int) -> ManifestRow:
    ts = {1: 1790659000000, 2: 1790660000000}[step]
    return dataclasses.replace(_row(step, ts), val_start_at=1, max_steps=2)


def test_counts_and_pass_at_k():
    s = _build(attempts_for_accuracy(0.7))
    assert s.instances == 251 and s.expected_attempts == 1004
    assert s.resolved_attempts == 176 and s.completed_attempts == 1004
    assert s.eval_accuracy == pytest.approx(176 / 251)
    assert s.pass_at_k["1"] == pytest.approx(176 / 251 / 4)
    assert s.avg_at_k == pytest.approx(176 / 1004) and isinstance(s.avg_at_k, float)
    assert s.complete and s.target_reached
    assert consistency_problems(s) == []


def test_errors_are_completed_attempts_and_missing_ones_are_failures():
    attempts = attempts_for_accuracy(1.0)
    attempts[0] = [AttemptResult("error")] * 4  # instance 0: every attempt errored
    attempts = attempts[:-1]  # the last instance never ran
    s = _build(attempts)
    assert s.missing_attempts == 4 and s.error_attempts == 4
    assert s.completed_attempts == 1000  # the errored ones ran: Tunix counts them completed
    assert not s.complete and not s.target_reached
    assert s.eval_accuracy == pytest.approx(249 / 251)
    assert s.status_counts == {"resolved": 249, "failed": 747, "error": 4}
    assert consistency_problems(s) == []  # incomplete, but it adds up
    assert any(p.field == "complete" for p in validity_problems(s, _row()))


def test_status_counts_use_the_evaluators_words():
    attempts = [[AttemptResult("resolved", 1.0, label="SUCCEEDED")] * 4] * 251
    attempts[0] = [AttemptResult("failed", label="MAX_CONTEXT_LIMIT_REACHED")] * 4
    assert _build(attempts).status_counts == {"MAX_CONTEXT_LIMIT_REACHED": 4, "SUCCEEDED": 1000}


def test_validity_against_row(tmp_path):
    run = make_run(str(tmp_path), accuracies={})
    row = run.row(18)
    at = dict(checkpoint=row, eval_start_ms=row.timestamp_ms + 1)
    at["eval_stop_ms"] = row.timestamp_ms + 2
    good = _build(attempts_for_accuracy(0.5), **at)
    assert validity_problems(good, row) == []
    other = dataclasses.replace(good, checkpoint_timestamp_ms=row.timestamp_ms + 1)
    assert any(p.field == "checkpoint_timestamp_ms" for p in validity_problems(other, row))
    fatal = _build(attempts_for_accuracy(0.9), fatal_error="weights fingerprint mismatch", **at)
    assert any("fatal" in str(p) for p in validity_problems(fatal, row))
    errored = _build([[AttemptResult("error")] * 4] * 251, **at)
    assert any("errored" in str(p) for p in validity_problems(errored, row))
    early = dataclasses.replace(good, eval_start_ms=row.timestamp_ms - 1)
    assert any(p.field == "eval_start_ms" for p in validity_problems(early, row))
    target = dataclasses.replace(good, target_accuracy=0.5)
    assert any(p.field == "target_accuracy" for p in validity_problems(target, row))


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
    d["avg_at_k"] = {"4": 0.3}  # rcpflow's old per-k object: not Tunix's type
    with pytest.raises(SummaryError, match="avg_at_k"):
        EvalSummary.from_json(json.dumps(d), where="x")
    with pytest.raises(SummaryError, match="not JSON"):
        EvalSummary.from_json("{", where="x")


def test_tunix_summary_is_read_with_eval_times_given():
    text = (FIXTURES / "summary_full.json").read_text()
    with pytest.raises(SummaryError, match=r"missing field.*eval_start_ms"):
        EvalSummary.from_json(text, where="tunix")
    s = EvalSummary.from_json(text, where="tunix", eval_times=TIMES)
    assert (s.eval_start_ms, s.eval_stop_ms) == TIMES
    assert s.status_counts["ERROR"] == 3 and s.error_attempts == 3
    assert validity_problems(s, _tunix_row(2)) == []
    # rcp_logged and any field a later Tunix adds are accepted and not carried over
    d = json.loads(text) | {"rcp_logged": True, "tunix_version": "0.1.8"}
    again = EvalSummary.from_dict(d, where="tunix", eval_times=TIMES)
    assert again == s and "rcp_logged" not in again.to_json()
    # written as rcpflow's summary it is read back unchanged, also its floats
    assert EvalSummary.from_json(s.to_json(), where="rcpflow") == s


def test_tunix_smoke_summary_is_never_valid():
    s = EvalSummary.from_json(
        (FIXTURES / "summary_smoke.json").read_text(), where="smoke", eval_times=TIMES
    )
    problems = validity_problems(s, _tunix_row(1))
    assert [str(p) for p in problems if p.field == "instances"] == [
        "instances: 64, the benchmark evaluates 251"
    ]
    assert s.target_reached  # Tunix said so; rcpflow never reads it


@pytest.mark.parametrize(
    ("change", "field"),
    [
        # the three holes: complete with 1004 missing, 5000 resolved of 1004, 1 attempt
        (dict(complete=True, completed_attempts=0, missing_attempts=1004), "complete"),
        (dict(resolved_attempts=5000), "resolved_attempts"),
        (
            dict(attempts_per_instance=1, expected_attempts=251, completed_attempts=251),
            "attempts_per_instance",
        ),
        (dict(pass_at_k={"1": 0.5577689243027888}), "pass_at_k"),
        (dict(target_reached=False), None),  # never read: changing it changes nothing
    ],
)
def test_a_summary_that_does_not_add_up_is_invalid(change, field):
    base = EvalSummary.from_json(
        (FIXTURES / "summary_full.json").read_text(), where="x", eval_times=TIMES
    )
    problems = validity_problems(dataclasses.replace(base, **change), _tunix_row(2))
    if field is None:
        assert problems == []
    else:
        assert any(p.field.startswith(field) for p in problems), problems


def test_needs_four_attempts():
    with pytest.raises(ValueError, match="attempts_per_instance"):
        _build(attempts_for_accuracy(0.5), attempts_per_instance=recipe.PASS_K - 1)


def test_attempts_that_disagree_with_the_summary_are_named():
    attempts = attempts_for_accuracy(0.7)
    s = _build(attempts)
    assert recomputed_problems(s, attempts, "a.jsonl") == []
    attempts[0] = [AttemptResult("failed")] * 4
    (problem,) = [p for p in recomputed_problems(s, attempts, "a.jsonl") if "4" in p.field]
    assert problem.field == 'pass_at_k["4"]' and "a.jsonl gives" in problem.message


def test_gate_is_strict_at_the_target(tmp_path):
    from rcpflow.verdict.gate import passes

    run = make_run(str(tmp_path), max_steps=18)
    s = _build(attempts_for_accuracy(0.5), checkpoint=run.row(18))
    at_target = dataclasses.replace(s, pass_at_k={"1": 0.2, "4": 0.69})
    above = dataclasses.replace(s, pass_at_k={"1": 0.2, "4": 0.6900001})
    assert not passes(at_target, run.row(18))
    assert passes(above, run.row(18))


# -- the property: any summary that breaks one rule of point 2 is invalid, naming the field ----


@st.composite
def valid_summaries(draw):
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    weights = draw(st.lists(st.integers(0, 9), min_size=5, max_size=5))
    if not any(weights):
        weights = [1, 1, 1, 1, 1]
    attempts = []
    for _ in range(251):
        c = rng.choices(range(5), weights=weights)[0]
        attempts.append([AttemptResult("resolved", 1.0)] * c + [AttemptResult("failed")] * (4 - c))
    return _build(attempts, eval_start_ms=T0 + 10, eval_stop_ms=T0 + 20)


def _other(draw, value: int) -> int:
    return draw(st.integers(-3, 3000).filter(lambda v: v != value))


@st.composite
def one_broken_rule(draw):
    s = draw(valid_summaries())
    rule = draw(
        st.sampled_from(
            [
                "instances", "attempts_per_instance", "expected_attempts", "completed_attempts",
                "missing_attempts", "resolved_attempts", "error_attempts", "complete",
                "status_counts", "pass@1", "pass@4", "pass_at_k range", "pass_at_k keys",
                "eval_stop_ms", "avg_at_k",
            ]
        )
    )  # fmt: skip
    if rule in ("instances", "attempts_per_instance", "expected_attempts", "missing_attempts"):
        return dataclasses.replace(s, **{rule: _other(draw, getattr(s, rule))}), rule
    if rule == "completed_attempts":
        return dataclasses.replace(s, completed_attempts=_other(draw, 1004)), rule
    if rule in ("resolved_attempts", "error_attempts"):
        v = draw(st.integers(s.completed_attempts + 1, 10_000))
        return dataclasses.replace(s, **{rule: v}), rule
    if rule == "complete":
        return dataclasses.replace(s, complete=False), rule
    if rule == "status_counts":
        delta = draw(st.integers(-50, 50).filter(bool))
        counts = dict(s.status_counts)
        key = draw(st.sampled_from(sorted(counts)))
        counts[key] += delta
        return dataclasses.replace(s, status_counts=counts), rule
    if rule == "pass@1":
        true = s.resolved_attempts / 1004
        v = draw(st.floats(-1, 2).filter(lambda x: abs(x - true) > 1e-8))
        return dataclasses.replace(s, pass_at_k={**s.pass_at_k, "1": v}), 'pass_at_k["1"]'
    if rule == "pass@4":
        lo, hi = -(-s.resolved_attempts // 4), s.resolved_attempts
        whole = draw(st.integers(0, 251))
        frac = draw(st.sampled_from([0.0, 0.25, 0.5]))
        if frac == 0.0 and lo <= whole <= hi:
            frac = 0.5  # a whole number in range is consistent: only attempts can refute it
        v = (whole + frac) / 251
        return dataclasses.replace(s, pass_at_k={**s.pass_at_k, "4": v}), 'pass_at_k["4"]'
    if rule == "pass_at_k range":
        key = draw(st.sampled_from(["1", "4"]))
        v = draw(st.one_of(st.floats(1.0001, 10), st.floats(-10, -0.0001)))
        return dataclasses.replace(s, pass_at_k={**s.pass_at_k, key: v}), f'pass_at_k["{key}"]'
    if rule == "pass_at_k keys":
        key = draw(st.sampled_from(["1", "4"]))
        return dataclasses.replace(
            s, pass_at_k={k: v for k, v in s.pass_at_k.items() if k != key}
        ), "pass_at_k"
    if rule == "eval_stop_ms":
        return dataclasses.replace(s, eval_stop_ms=T0 + draw(st.integers(0, 9))), rule
    v = draw(st.floats(-1, 2).filter(lambda x: abs(x - s.avg_at_k) > 1e-8))
    return dataclasses.replace(s, avg_at_k=v), "avg_at_k"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_summaries())
def test_property_built_summaries_are_consistent(s):
    assert consistency_problems(s) == []
    assert validity_problems(s, _row()) == []


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(one_broken_rule())
def test_property_one_broken_rule_is_invalid_and_named(case):
    s, field = case
    problems = validity_problems(s, _row())
    assert problems, f"{field} broken but valid"
    assert any(field in p.field for p in problems), (field, problems)
