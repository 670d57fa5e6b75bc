"""`rcpflow forecast` takes only bounded numbers and does bounded work (issue 29): a huge --window,
--max-steps or 1e308 seconds is one usage line naming the flag, never MemoryError or
OverflowError, and any accepted request simulates at most the forecast's bound of steps (its work,
counted, not timed); after_training honours the
poll, so it is never faster than during_training for the same W."""

from __future__ import annotations

import heapq
from dataclasses import replace

import pytest
from outside_input import forecast_args

from rcpflow.cli.forecast import report, request_from
from rcpflow.planning import forecast
from rcpflow.planning.forecast import WORK_MAX, ForecastUsageError, Scenario, simulate

BASE = ("--step-seconds", "185", "--eval-seconds", "1700", "--eval-chips", "64",
        "--train-chips", "128", "--val-start-at", "18")  # fmt: skip


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--max-steps", "60", "--passing-step", "20", "--window", str(10**12)), "--window"),
        (("--max-steps", "60", "--passing-step", "20", "--window", "1-1000000000000"), "--window"),
        (("--max-steps", str(10**12), "--passing-step", "20"), "--max-steps"),
        (("--max-steps", "60", "--passing-step", "20-99999999999999"), "--passing-step"),
        (("--max-steps", "60", "--passing-step", "20", "--poll-seconds", "1e308"), "--poll"),
        (("--max-steps", "60", "--passing-step", "20", "--task-start-seconds", "1e308"), "--task"),
        (("--max-steps", "60", "--passing-step", "20", "--step-seconds", "1e308"), "--step-sec"),
        (("--max-steps", "60", "--passing-step", "20", "--eval-seconds", "nan"), "--eval-sec"),
        (("--max-steps", "60", "--passing-step", "20", "--eval-chips", "1" * 40), "--eval-chips"),
        (("--max-steps", "60", "--passing-step", "20", "--window", "9" * 5000), "--window"),
        (("--max-steps", "10000", "--passing-step", "20-10000", "--window", "1-5"), "--window"),
        (("--max-steps", "5000", "--passing-step", "20-40", "--recommend"), "--recommend"),
    ],
)
def test_an_unbounded_number_is_a_usage_error_naming_the_flag(args, flag):
    argv = list(BASE)
    for i in range(0, len(args), 2):  # a later flag replaces the base's
        if args[i] in argv:
            argv[argv.index(args[i]) + 1] = args[i + 1]
            continue
        argv += args[i : i + 2] if i + 1 < len(args) else args[i:]
    with pytest.raises(ForecastUsageError, match=flag):
        request_from(forecast_args(*argv))


@pytest.mark.parametrize(
    "args",
    [
        ("--max-steps", "10000", "--passing-step", "10000", "--window", "1-4"),
        ("--max-steps", "10000", "--passing-step", "18", "--window", "10000"),
        ("--max-steps", "2000", "--passing-step", "2000", "--recommend"),
        ("--max-steps", "60", "--passing-step", "18-60", "--window", "1,3,10", "--recommend"),
    ],
)
def test_an_accepted_request_does_bounded_work(args, monkeypatch):
    request = request_from(forecast_args(*BASE, *args))
    popped = 0
    heappop = heapq.heappop

    def counting_heappop(heap: list[float]) -> float:
        nonlocal popped
        popped += 1  # one per simulated step: simulate() pops an evaluation slot for each
        return heappop(heap)

    monkeypatch.setattr(forecast.heapq, "heappop", counting_heappop)
    report(request)
    assert 0 < popped <= WORK_MAX


def test_after_training_honours_the_poll():
    s = Scenario(
        step_seconds=60, eval_seconds=600, val_start_at=18, max_steps=60, passing_step=20,
        schedule="after_training", window=1, poll_seconds=10_000,
    )  # fmt: skip
    after = simulate(s)
    during = simulate(replace(s, schedule="during_training"))
    assert during.verdict_s <= after.verdict_s  # before: after 4200 s, during 10_600 s
    assert after.verdict_s == pytest.approx(10_000 + 3 * 600)
