"""The checkpoint storage a forecast run costs, with and without retention (hand-computed)."""

from __future__ import annotations

import json

import pytest
from rcpflow_cli import run_cli

from rcpflow.planning.forecast import ForecastUsageError, Scenario, simulate
from rcpflow.planning.storage_forecast import (
    CheckpointSizes,
    checked_lag,
    sizes_from_model,
    storage,
)


def _during(**kw: object) -> Scenario:
    """One-second steps and evaluations from step 1 to 10, W = 1, step 2 passing."""
    base: dict[str, object] = {"step_seconds": 1.0, "eval_seconds": 1.0, "val_start_at": 1}
    base |= {"max_steps": 10, "passing_step": 2, "schedule": "during_training", "window": 1}
    return Scenario(**{**base, **kw})  # type: ignore[arg-type]


def test_during_training_retention_lowers_the_peak_and_the_storage_hours() -> None:
    # step 1 evaluated [1, 2], step 2 [2, 3] passes: verdict 3, training stops after step 3
    f = simulate(_during())
    assert (f.verdict_s, f.steps_trained, f.run_end_s) == (3.0, 3, 3.0)
    sizes = CheckpointSizes(weights_tb=1.0)
    without = storage(f, sizes, retention=False)
    assert (without.peak_tb, without.peak_checkpoints, without.written_tb) == (3.0, 3, 3.0)
    assert without.tb_hours == pytest.approx(3 / 3600)  # 1 TB for 1 s, then 2 TB for 1 s
    kept = storage(f, sizes, retention=True)
    # step 1 goes at its evaluation's end (2), step 3 at the verdict (3): two at most at once
    assert (kept.peak_tb, kept.peak_checkpoints, kept.written_tb) == (2.0, 2, 3.0)
    assert kept.tb_hours == pytest.approx(2 / 3600)


def test_checkpoints_without_a_summary_above_the_pass_stay_until_the_run_is_settled() -> None:
    # W = 3, evaluations of 2.5 s: step 1 [1, 3.5], step 2 [2, 4.5] passes; steps 3 and 4
    # stopped at the verdict (4.5), step 5 written at 5 (training ends the step it is in)
    f = simulate(_during(eval_seconds=2.5, window=3))
    assert (f.verdict_s, f.steps_trained, f.run_end_s) == (4.5, 5, 5.0)
    assert [(e.step, e.outcome) for e in f.evaluations][2:] == [(3, "cancelled"), (4, "cancelled")]
    kept = storage(f, CheckpointSizes(1.0), retention=True)
    # 3 and 4 have no summary: kept past the verdict until training's end (5), when 5 is on
    # storage too: 2, 3, 4, 5 at once
    assert kept.peak_checkpoints == 4
    assert kept.tb_hours == pytest.approx((1 + 2 + 1.5 + 1 + 3) / 3600)


def test_after_training_every_checkpoint_is_on_storage_when_training_ends() -> None:
    f = simulate(_during(schedule="after_training", max_steps=4))
    kept = storage(f, CheckpointSizes(1.0), retention=True)
    assert (kept.peak_checkpoints, kept.peak_tb) == (4, 4.0)
    # 1+2+3 TB-s while training, 4 TB from 4 to 5 (step 1's evaluation ends), 3 TB to 6
    assert kept.tb_hours == pytest.approx(13 / 3600)
    assert storage(f, CheckpointSizes(1.0), retention=False).tb_hours == pytest.approx(14 / 3600)


def test_full_states_go_when_a_newer_one_is_written_or_training_ends() -> None:
    # steps 1..4 evaluated one after another, step 4 passes at 5, training stops after step 5
    f = simulate(_during(passing_step=4))
    assert (f.verdict_s, f.steps_trained, f.training_end_s) == (5.0, 5, 5.0)
    sizes = CheckpointSizes(weights_tb=1.0, full_state_tb=4.0, full_every=2)  # steps 1, 3, 5
    without = storage(f, sizes, retention=False)
    assert (without.peak_tb, without.written_tb) == (5.0 + 12.0, 17.0)
    assert without.tb_hours == pytest.approx((5 + 6 + 11 + 12) / 3600)
    kept = storage(f, sizes, retention=True)
    # step 1 (full) is kept whole until step 3's full state is written at 3, then goes with
    # step 2 (evaluated at 3); step 3's goes at training's end (5)
    assert (kept.peak_tb, kept.peak_checkpoints) == (3.0 + 8.0, 3)
    assert kept.tb_hours == pytest.approx((5 + 6 + 5 + 6) / 3600)


def test_a_retention_lag_delays_each_deletion_and_raises_the_peak() -> None:
    # steps 1..4 evaluated one after another (step k's evaluation ends at k + 1), step 4 passes
    # at 5, training stops after step 5: with no lag step k < 4 goes at k + 1, as k + 1 is
    # written, so two at most at once; a lag of L seconds keeps it L more, L more on storage
    f = simulate(_during(passing_step=4))
    assert (f.verdict_s, f.steps_trained, f.run_end_s) == (5.0, 5, 5.0)
    sizes = CheckpointSizes(1.0)
    peaks = [storage(f, sizes, True, lag_s=lag).peak_checkpoints for lag in (0.0, 1.0, 2.0)]
    assert peaks == [2, 3, 4]
    assert storage(f, sizes, retention=False).peak_checkpoints == 5
    # no lag: one TB from 1 to 5 (step 5 goes at the verdict, 5, as it is written)
    assert storage(f, sizes, True).tb_hours == pytest.approx(4 / 3600)
    # half a second: step 1 goes at 2.5, 2 at 3.5, 3 at 4.5, so two TB for half of each second
    # from 2; step 5's deletion (5.5) falls after the run's end and is not counted
    half = storage(f, sizes, True, lag_s=0.5)
    assert (half.peak_checkpoints, half.peak_tb, half.written_tb) == (2, 2.0, 5.0)
    assert half.tb_hours == pytest.approx((1 + 1.5 + 1.5 + 1.5) / 3600)
    # no lag is today's forecast, the full states' too (steps 1, 3, 5; the test above)
    full = CheckpointSizes(weights_tb=1.0, full_state_tb=4.0, full_every=2)
    assert storage(f, full, True, lag_s=0.0) == storage(f, full, True)
    assert storage(f, full, True).peak_tb == 3.0 + 8.0
    # a superseded full state waits the lag too: step 1 (weights and train_state/) and step 2
    # go at 4, after step 4 is written: four weights and two full states then
    assert storage(f, full, True, lag_s=1.0).peak_tb == 4.0 + 8.0


@pytest.mark.parametrize("lag", [-1.0, float("nan"), float("inf"), 1e7 + 1])
def test_a_bad_retention_lag_is_refused(lag: float) -> None:
    f = simulate(_during())
    with pytest.raises(ForecastUsageError, match="--retention-lag-s"):
        storage(f, CheckpointSizes(1.0), retention=False, lag_s=lag)
    assert checked_lag(1e7) == 1e7 and checked_lag(0.0) == 0.0


def test_sizes_from_the_model_and_bad_sizes() -> None:
    s = sizes_from_model(397)
    assert s.weights_tb == pytest.approx(0.794) and s.full_state_tb == pytest.approx(4.764)
    with pytest.raises(ForecastUsageError, match="--model-params-b"):
        sizes_from_model(float("nan"))
    with pytest.raises(ForecastUsageError, match="--weights-tb"):
        CheckpointSizes(-1.0)
    with pytest.raises(ForecastUsageError, match="--full-state-every"):
        CheckpointSizes(1.0, 1.0, 0)


FORECAST = ("forecast", "--step-seconds", "185", "--eval-seconds", "1665", "--eval-chips", "16")
FORECAST += ("--train-chips", "128", "--max-steps", "40", "--passing-step", "24")


def test_forecast_reports_storage_beside_time() -> None:
    p = run_cli(*FORECAST, "--window", "10", "--model-params-b", "397", "--full-state-every", "10")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("checkpoint storage:")))
    assert "0.794 TB weights a step, a full state (4.764 TB more) every 10 steps" in lines[head]
    assert lines[head + 1].split()[:5] == ["schedule", "W", "pass", "peak", "TB"]
    during = next(line for line in lines[head:] if line.startswith("during_training"))
    peak_off, peak_on = map(float, during.split()[3:5])
    assert peak_on < peak_off
    p = run_cli(*FORECAST, "--weights-tb", "0.8", "--json")
    rows = json.loads(p.stdout)["storage"]["forecasts"]
    assert {r["schedule"] for r in rows} == {"after_training", "during_training"}
    assert all(r["with"]["peak_tb"] <= r["without"]["peak_tb"] for r in rows)
    assert "storage" not in json.loads(run_cli(*FORECAST, "--json").stdout)  # sizes not given


def test_the_retention_lag_flag_reaches_the_storage_forecast() -> None:
    def with_retention(*flags: str) -> dict[str, object]:
        p = run_cli(*FORECAST, "--window", "10", "--weights-tb", "1", "--json", *flags)
        assert p.returncode == 0, p.stderr
        data = json.loads(p.stdout)["storage"]
        (during,) = [r for r in data["forecasts"] if r["schedule"] == "during_training"]
        return {"lag": data["retention_lag_s"], **during["with"]}

    at_once, lagged = with_retention(), with_retention("--retention-lag-s", "1000")
    assert (at_once["lag"], lagged["lag"]) == (0.0, 1000.0)
    assert lagged["peak_checkpoints"] > at_once["peak_checkpoints"]  # type: ignore[operator]
    p = run_cli(*FORECAST, "--window", "10", "--weights-tb", "1", "--retention-lag-s", "1000")
    assert "each deletion 1000 s after (--retention-lag-s)" in p.stdout


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--model-params-b", "397", "--weights-tb", "1"), "--model-params-b"),
        (("--full-state-tb", "4"), "--full-state-tb needs --weights-tb"),
        (("--weights-tb", "nan"), "--weights-tb"),
        (("--weights-tb", "1", "--full-state-every", "0"), "--full-state-every"),
        (("--weights-tb", "1", "--retention-lag-s", "-1"), "--retention-lag-s -1.0 must be"),
        (("--weights-tb", "1", "--retention-lag-s", "nan"), "--retention-lag-s 'nan' is not"),
        (("--retention-lag-s", "10"), "--retention-lag-s needs --weights-tb"),
    ],
)
def test_bad_storage_flags_are_one_usage_line(flags: tuple[str, ...], named: str) -> None:
    p = run_cli(*FORECAST, *flags)
    assert p.returncode == 2 and named in p.stderr and "Traceback" not in p.stderr
