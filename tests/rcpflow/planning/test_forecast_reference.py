"""`rcpflow forecast --schedule reference`: the MLCommons reference's own schedule (NeMo-RL's
deferred evaluator after training, in the training's allocation, W = 1), to compare with W and
during_training."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_forecast import SEED, SEED_FLAGS, _forecast

from rcpflow.planning.forecast import ForecastUsageError, simulate


def test_the_reference_evaluates_one_at_a_time_on_the_held_training_nodes() -> None:
    for p in (18, 20, 24):
        f = simulate(replace(SEED, schedule="reference", passing_step=p))
        verdict = 60 * 185 + (p - 18 + 1) * 1700  # no task start: the same allocation
        assert f.verdict_s == pytest.approx(verdict)
        assert [e.step for e in f.evaluations] == list(range(18, p + 1))
        assert f.eval_chip_hours == 0.0  # on the training's chips ...
        assert f.train_chip_hours == pytest.approx(verdict * 128 / 3600)  # ... held to the end
    with pytest.raises(ForecastUsageError, match="--window 3: the reference schedule is W = 1"):
        replace(SEED, schedule="reference", window=3)


def test_the_command_compares_the_reference_with_the_dags_schedules() -> None:
    p = _forecast(*SEED_FLAGS, "--passing-step", "20", "--window", "1,3", "--schedule", "all")
    assert p.returncode == 0, p.stderr
    names = ("after", "during", "reference")
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith(names)]
    assert [(r[0], r[1]) for r in rows] == [
        ("after_training", "1"), ("after_training", "3"),
        ("during_training", "1"), ("during_training", "3"),
        ("reference", "1"),
    ]  # fmt: skip
    reference, during = float(rows[-1][3]), float(rows[3][3])
    assert during < reference
    p = _forecast(*SEED_FLAGS, "--passing-step", "20", "--schedule", "reference,during_training")
    assert p.returncode == 0, p.stderr
    p = _forecast(*SEED_FLAGS, "--passing-step", "20", "--schedule", "reference,soon")
    assert p.returncode == 2 and "--schedule 'reference,soon'" in p.stderr
