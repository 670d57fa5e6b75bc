"""Property-based (issue 29): the rehearsal curve and profile and the forecast's flags are
accepted (and read back) or refused in one named line, never a traceback; and the forecast's
invariants: a larger W is never slower, during_training is never slower than after_training for
the same W and latencies, chip-hours are never negative."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from outside_input import accepted_or_one_line, forecast_args

from rcpflow.cli.forecast import report, request_from
from rcpflow.planning.forecast import ForecastUsageError, Scenario, simulate
from rcpflow.planning.rehearsal import RehearsalInputError, parse_curve, parse_profile

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CELL = st.one_of(
    st.sampled_from(["0", "0.5", "1", "1.5", "-0", "nan", "inf", "1e400", "", " ", '"', '"a,b"']),
    st.floats(0, 1).map(repr),
    st.text(max_size=5),
)


@SETTINGS
@given(
    st.lists(st.sampled_from(["step", "seed_1", "seed_2", "seed_\u00b3", "seed_", " step"]),
             min_size=0, max_size=4),
    st.lists(st.lists(CELL, min_size=0, max_size=4), max_size=5),
    st.sampled_from(["", "# a comment\n", "\n\n"]),
)  # fmt: skip
def test_a_curve_is_read_back_or_refused_in_one_line(header, rows, lead):
    text = lead + ",".join(header) + "\n" + "\n".join(",".join(r) for r in rows) + "\n"
    curve = accepted_or_one_line(RehearsalInputError, "c.csv", parse_curve, text, "c.csv")
    if curve is None:
        return
    again = (
        "step,"
        + ",".join(f"seed_{s}" for s in curve.seeds)
        + "\n"
        + "".join(
            f"{k},{','.join(repr(curve.values[s][k - 1]) for s in curve.seeds)}\n"
            for k in range(1, curve.steps + 1)
        )
    )
    assert parse_curve(again, "again").values == curve.values


NUMBER = st.one_of(
    st.integers(-(2**80), 2**80).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(
        lambda f: (
            "nan"
            if math.isnan(f)
            else ("inf" if f == math.inf else ("-inf" if f < 0 and math.isinf(f) else repr(f)))
        )
    ),
    st.sampled_from(['"185"', "true", "[1]", "{}"]),
)


@SETTINGS
@given(st.dictionaries(
    st.sampled_from(["step_seconds", "eval_seconds", "train_chips", "eval_chips", "other"]),
    NUMBER, max_size=5,
))  # fmt: skip
def test_a_profile_is_read_back_or_refused_in_one_line(table):
    text = "\n".join(f"{k} = {v}" for k, v in table.items())
    profile = accepted_or_one_line(RehearsalInputError, "p.toml", parse_profile, text, "p.toml")
    if profile is None:
        return
    again = (
        f"step_seconds = {profile.step_seconds!r}\neval_seconds = {profile.eval_seconds!r}\n"
        f"train_chips = {profile.train_chips}\neval_chips = {profile.eval_chips}\n"
    )
    assert parse_profile(again, "again") == profile


FLAG_TEXT = st.one_of(
    st.integers(-5, 10**13).map(str),
    st.sampled_from(
        ["1e308", "nan", "inf", "-1", "0", "1.5", "18-20", "1-99999999", "x", "", "5e-324"]
    ),
    st.floats(0.001, 1e9).map(repr),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(
    st.sampled_from(["--step-seconds", "--eval-seconds", "--max-steps", "--passing-step",
                     "--window", "--poll-seconds", "--task-start-seconds", "--eval-chips",
                     "--val-start-at", "--global-batch-size"]),
    FLAG_TEXT, max_size=10,
), st.booleans())  # fmt: skip
def test_forecast_flags_answer_or_name_the_flag_in_one_line(flags, recommend):
    base = {"--step-seconds": "185", "--eval-seconds": "1700", "--train-chips": "1",
            "--eval-chips": "1", "--max-steps": "60", "--passing-step": "20"}  # fmt: skip
    base.update(flags)
    argv = [x for kv in base.items() for x in kv] + (["--recommend"] if recommend else [])
    request = accepted_or_one_line(
        ForecastUsageError, "--", lambda: request_from(forecast_args(*argv))
    )
    if request is None:
        return
    out = report(request)
    assert out["forecasts"]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    max_steps = draw(st.integers(2, 80))
    val_start_at = draw(st.integers(1, max_steps))
    return Scenario(
        step_seconds=draw(st.floats(1, 1e4)),
        eval_seconds=draw(st.floats(1, 1e5)),
        val_start_at=val_start_at,
        max_steps=max_steps,
        passing_step=draw(st.integers(val_start_at, max_steps)),
        schedule="after_training",
        window=draw(st.integers(1, 12)),
        task_start_seconds=draw(st.one_of(st.just(0.0), st.floats(1e-3, 600))),
        poll_seconds=draw(st.one_of(st.just(0.0), st.floats(1e-3, 5e4))),
        cancel=draw(st.booleans()),
    )


@SETTINGS
@given(st.data())
def test_the_forecasts_invariants(data):
    s = data.draw(scenarios())
    for schedule in ("after_training", "during_training"):
        one = replace(s, schedule=schedule)
        wider = simulate(replace(one, window=one.window + data.draw(st.integers(1, 10))))
        assert wider.verdict_s <= simulate(one).verdict_s + 1e-6  # W larger: never slower
        f = simulate(one)
        assert f.eval_chip_hours >= 0 and f.train_chip_hours >= 0 and f.wasted_chip_hours >= 0
    after = simulate(s)
    during = simulate(replace(s, schedule="during_training"))
    assert during.verdict_s <= after.verdict_s + 1e-6  # during never slower than after
