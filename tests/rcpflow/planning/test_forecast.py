"""`rcpflow forecast`: the simulation against hand-computed runs, and its command line."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from forecast_scenarios import SEED
from rcpflow_cli import run_cli

from rcpflow.cli.forecast import parse_steps
from rcpflow.planning.forecast import ForecastUsageError, recommend, simulate


def test_after_training_with_one_slot_evaluates_up_the_steps_after_max_steps() -> None:
    for p in (18, 20, 24):
        f = simulate(replace(SEED, passing_step=p))
        # T = max_steps * step + (p - v + 1) * eval
        assert f.verdict_s == pytest.approx(60 * 185 + (p - 18 + 1) * 1700)
        assert [e.step for e in f.evaluations] == list(range(18, p + 1))
        assert f.wasted == 0 and f.steps_trained == 60
        assert f.eval_chip_hours == pytest.approx((p - 17) * 1700 * 64 / 3600)
        assert f.train_chip_hours == pytest.approx(60 * 185 * 128 / 3600)


def test_after_training_window_evaluates_in_batches_and_wastes_what_started_above_p() -> None:
    f = simulate(replace(SEED, window=10))
    # steps 18..27 all start when training ends; 20 passes in the first batch
    assert f.verdict_s == pytest.approx(60 * 185 + 1700)
    assert [e.step for e in f.evaluations] == list(range(18, 28))
    assert f.wasted == 7  # 21..27
    two_batches = simulate(replace(SEED, window=2, passing_step=21))
    assert two_batches.verdict_s == pytest.approx(60 * 185 + 2 * 1700)
    assert two_batches.wasted == 0  # 18, 19 | 20, 21


def test_during_training_with_enough_slots_decides_near_the_passing_checkpoint() -> None:
    # W >= eval / step (9.2): every checkpoint is evaluated the moment it exists
    for p in (18, 20, 24):
        f = simulate(replace(SEED, schedule="during_training", window=10, passing_step=p))
        assert f.verdict_s == pytest.approx(p * 185 + 1700)
        assert f.verdict_ratio == pytest.approx(1.0)
        # the request lands at the verdict; the trainer ends the step it is in
        assert f.steps_trained == -(-(p * 185 + 1700) // 185)
        assert f.steps_trained < 60


def test_during_training_with_one_slot_queues_behind_the_evaluations() -> None:
    f = simulate(replace(SEED, schedule="during_training"))
    # 18 at 3330 s; 19 and 20 wait for the slot
    assert [(e.step, e.start_s) for e in f.evaluations] == [
        (18, 3330.0),
        (19, 5030.0),
        (20, 6730.0),
    ]
    assert f.verdict_s == pytest.approx(8430)
    assert f.steps_trained == 46  # ceil(8430 / 185)
    assert f.wasted == 0


def test_wasted_evaluations_are_those_above_p_that_started_before_the_pass() -> None:
    f = simulate(replace(SEED, schedule="during_training", window=3))
    # 18, 19, 20 start at 3330, 3515, 3700; 21 and 22 take the slots 18 and 19 free (5030,
    # 5215), before 20 passes at 5400; 23 would start at 5400: the gate skips it
    assert [e.step for e in f.evaluations] == [18, 19, 20, 21, 22]
    assert f.wasted == 2
    assert [e.outcome for e in f.evaluations][3:] == ["cancelled", "cancelled"]
    assert [e.end_s for e in f.evaluations][3:] == [5400.0, 5400.0]  # stopped at the pass
    kept = simulate(replace(SEED, schedule="during_training", window=3, cancel=False))
    assert kept.wasted == 2 and kept.verdict_s == f.verdict_s
    assert [e.end_s for e in kept.evaluations][3:] == [5030.0 + 1700, 5215.0 + 1700]
    assert kept.wasted_chip_hours == pytest.approx(2 * 1700 * 64 / 3600)
    assert f.wasted_chip_hours == pytest.approx((370 + 185) * 64 / 3600)
    assert kept.run_end_s == pytest.approx(5215 + 1700)


def test_overheads_delay_each_task_start_and_poll() -> None:
    after = simulate(replace(SEED, task_start_seconds=10))
    # load_manifest, then evaluate; each next evaluation 10 s after the slot frees
    assert after.verdict_s == pytest.approx(11100 + 20 + 3 * 1700 + 2 * 10)
    during = simulate(
        replace(SEED, schedule="during_training", window=10, task_start_seconds=5, poll_seconds=60)
    )
    # step 20's checkpoint at 3700 s is seen at the poll of 3720 s, evaluated from 3725 s
    assert during.verdict_s == pytest.approx(3725 + 1700)


def test_recommend_picks_the_smallest_window_within_ten_percent_of_the_best() -> None:
    r = recommend(SEED, [20], "during_training")
    best = simulate(replace(SEED, schedule="during_training", window=r.best_window)).verdict_s
    assert r.best_verdict_s == pytest.approx(best)
    assert r.verdict_s <= 1.1 * best
    below = simulate(replace(SEED, schedule="during_training", window=r.window - 1)).verdict_s
    assert below > 1.1 * best
    assert r.window == 3  # 5400 s at W = 3 is the best; W = 2 gives 6730 s
    after = recommend(SEED, [18, 19, 20, 21, 22, 23, 24], "after_training")
    assert after.window == 3 and after.best_window == 7


def test_parse_steps() -> None:
    assert parse_steps("--passing-step", "18-20,24") == (18, 19, 20, 24)
    assert parse_steps("--window", "10") == (10,)
    for bad in ("x", "20-18", "18,18", "1-", " 10", "18 -20", "18, 20", "1_0"):
        with pytest.raises(ForecastUsageError, match="--window"):
            parse_steps("--window", bad)


def test_a_scenario_names_the_bad_flag() -> None:
    with pytest.raises(ForecastUsageError, match="--passing-step 17"):
        replace(SEED, passing_step=17)
    with pytest.raises(ForecastUsageError, match="--window 0"):
        replace(SEED, window=0)
    with pytest.raises(ForecastUsageError, match="--eval-seconds"):
        replace(SEED, eval_seconds=0)


def _forecast(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("forecast", *args)


SEED_FLAGS = (
    "--step-seconds", "185", "--eval-seconds", "1700", "--eval-chips", "64",
    "--train-chips", "128", "--val-start-at", "18", "--max-steps", "60",
)  # fmt: skip


def test_the_command_prints_each_schedule_and_window_and_json() -> None:
    p = _forecast(*SEED_FLAGS, "--passing-step", "20", "--window", "1,3,10", "--recommend")
    assert p.returncode == 0, p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith(("after", "during"))]
    # per schedule, (W, verdict hours)
    after = (("1", "4.50"), ("3", "3.56"), ("10", "3.56"))
    during = (("1", "2.34"), ("3", "1.50"), ("10", "1.50"))
    assert [(r[0], r[1], r[3]) for r in rows] == [
        *(("after_training", w, hours) for w, hours in after),
        *(("during_training", w, hours) for w, hours in during),
    ]
    assert "recommend during_training: W = 3" in p.stdout
    j = _forecast(*SEED_FLAGS, "--passing-step", "18-24", "--schedule", "after_training", "--json")
    data = json.loads(j.stdout)
    assert [f["passing_step"] for f in data["forecasts"]] == list(range(18, 25))
    (summary,) = data["summary"]
    assert summary["verdict_h"]["low"] == pytest.approx((11100 + 1700) / 3600)
    assert summary["verdict_h"]["high"] == pytest.approx((11100 + 7 * 1700) / 3600)


def test_the_command_reads_a_profile(tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text(
        "step_seconds = 185\neval_seconds = 1700.0\ntrain_chips = 128\neval_chips = 64\n"
    )
    p = _forecast("--profile", str(profile), "--max-steps", "60", "--passing-step", "20", "--json")
    assert p.returncode == 0, p.stderr
    first = json.loads(p.stdout)["forecasts"][0]
    assert (first["verdict_s"], first["eval_chips"], first["val_start_at"]) == (16200, 64, 18)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--passing-step", "17"), "--passing-step 17"),
        (("--passing-step", "20-x"), "--passing-step"),
        (("--passing-step", "20", "--window", "0"), "--window 0"),
        (("--passing-step", "20", "--schedule", "soon"), "--schedule 'soon'"),
        # names and numbers match whole: no spaces stripped, no _ taken
        (("--passing-step", "20", "--schedule", " both"), "--schedule ' both'"),
        (("--passing-step", "20", "--schedule", "after_training, during_training"), "--schedule"),
        (("--passing-step", "20", "--window", " 3"), "--window ' 3'"),
        (("--passing-step", "20", "--step-seconds", "185 "), "--step-seconds '185 '"),
        (("--passing-step", "20", "--eval-chips", "6_4"), "--eval-chips '6_4'"),
        (("--passing-step", "20", "--task-start-seconds", "-1"), "--task-start-seconds"),
        (("--passing-step", "20", "--profile", "/nonexistent.toml"), "--profile"),
        ((), "--passing-step is required"),
    ],
)
def test_bad_input_is_one_usage_line_naming_the_flag(args: tuple[str, ...], flag: str) -> None:
    p = _forecast(*SEED_FLAGS, *args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    (line,) = p.stderr.splitlines()
    assert line.startswith("usage error: ") and flag in line, line


def test_a_missing_figure_without_a_profile_is_named() -> None:
    p = _forecast("--max-steps", "60", "--passing-step", "20")
    assert p.returncode == 2
    assert p.stderr.strip() == (
        "usage error: --step-seconds is required (or give --profile) (see rcpflow forecast --help)"
    )
