"""The forecast's machine model (issue 37): a deferred evaluate's resume is one more task start,
CPU seconds stretch by the runnable processes over the cores (the run's own task starts in
flight, the other runs of a submission, the background), and its defaults change nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest
from forecast_scenarios import SEED, SMALL

from rcpflow.planning.forecast import ForecastUsageError, simulate


def test_the_defaults_model_no_machine() -> None:
    plain = simulate(SMALL)
    # cpu seconds without cores, cores without cpu seconds: the fixed start alone, no stretch
    for change in ({"task_cpu_seconds": 0.0, "cores": 2}, {"cores": 0, "background_processes": 9}):
        assert simulate(replace(SMALL, **change)).verdict_s == pytest.approx(plain.verdict_s)
    # after training, W=1: the training's end seen at a poll, load_manifest, then per step a
    # task start and the evaluation
    assert plain.verdict_s == pytest.approx(111.0 + 1.0 + 3 * (1.0 + 17.0))


def test_a_resume_is_one_more_task_start_per_evaluation() -> None:
    plain = simulate(SMALL)
    resumed = simulate(replace(SMALL, resume_starts=1))
    assert resumed.verdict_s == pytest.approx(plain.verdict_s + 3 * 1.0)  # steps 18, 19, 20


def test_cpu_seconds_on_an_idle_machine_are_not_stretched() -> None:
    # one run, one evaluation at a time, many cores: each task start is 1 + 2 s, the job 17 + 1
    s = replace(SMALL, task_cpu_seconds=2.0, job_cpu_seconds=1.0, cores=64)
    assert simulate(s).verdict_s == pytest.approx(111.0 + 3.0 + 3 * (3.0 + 18.0))


def test_background_processes_stretch_cpu_seconds_over_the_cores() -> None:
    # 5 background + this task start = 6 runnable on 2 cores: CPU runs at a third
    s = replace(SMALL, task_cpu_seconds=2.0, cores=2, background_processes=5)
    assert simulate(s).verdict_s == pytest.approx(111.0 + (1 + 6.0) + 3 * (1 + 6.0 + 17.0))


def test_the_runs_of_a_submission_load_the_machine_together() -> None:
    one = replace(SMALL, task_cpu_seconds=2.0, cores=2)
    three = replace(one, concurrent_runs=3)
    # three runs' task starts at once: 3 runnable on 2 cores
    assert simulate(three).verdict_s == pytest.approx(111.0 + 4 * (1 + 3.0) + 3 * 17.0)
    assert simulate(one).verdict_s < simulate(three).verdict_s


def test_task_starts_in_flight_stretch_a_window_of_starts_at_once() -> None:
    # after training with W=3: steps 18, 19, 20 are queued together; each start sees the ones
    # before it in flight (1, 2, 3 runnable on 1 core)
    s = replace(SMALL, window=3, task_cpu_seconds=2.0, cores=1, task_start_seconds=0.0)
    f = simulate(s)
    manifest_loaded = 111.0 + 2.0
    starts = [e.start_s - manifest_loaded for e in f.evaluations[:3]]
    assert starts == pytest.approx([2.0, 4.0, 6.0])
    assert f.verdict_s == pytest.approx(manifest_loaded + 6.0 + 17.0)


def test_at_full_scale_the_same_seconds_are_negligible() -> None:
    full = replace(SEED, schedule="during_training", window=10)
    loaded = replace(
        full, task_start_seconds=1.0, resume_starts=1, task_cpu_seconds=1.4,
        job_cpu_seconds=1.2, cores=2, background_processes=6, concurrent_runs=3,
    )  # fmt: skip
    assert simulate(loaded).verdict_s / simulate(full).verdict_s < 1.02
    # while at 1/100 the same machine adds far more than 15 %
    small = replace(full, step_seconds=1.85, eval_seconds=17.0)
    small_loaded = replace(loaded, step_seconds=1.85, eval_seconds=17.0)
    assert simulate(small_loaded).verdict_s / simulate(small).verdict_s > 1.3


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"resume_starts": 2}, "--resume-starts"),
        ({"resume_starts": -1}, "--resume-starts"),
        ({"cores": -1}, "--cores"),
        ({"cores": 10**9}, "--cores"),
        ({"task_cpu_seconds": float("nan")}, "--task-cpu-seconds"),
        ({"job_cpu_seconds": -1.0}, "--job-cpu-seconds"),
        ({"background_processes": float("inf")}, "--background-processes"),
        ({"background_processes": -0.5}, "--background-processes"),
        ({"concurrent_runs": 0}, "--concurrent-runs"),
        ({"concurrent_runs": 10**6}, "--concurrent-runs"),
    ],
)
def test_a_machine_outside_its_bounds_is_refused_naming_the_flag(change, flag) -> None:
    with pytest.raises(ForecastUsageError, match=flag):
        replace(SMALL, **change)


def test_the_command_line_takes_the_machine_and_refuses_it_out_of_bounds() -> None:
    from outside_input import forecast_args

    from rcpflow.cli.forecast import render_text, report, request_from

    base = ("--step-seconds", "1.85", "--eval-seconds", "17", "--eval-chips", "64",
            "--train-chips", "128", "--val-start-at", "18", "--max-steps", "60",
            "--passing-step", "20", "--schedule", "after_training", "--task-start-seconds", "1",
            "--poll-seconds", "0.5")  # fmt: skip
    machine = ("--resume-starts", "1", "--cores", "2", "--task-cpu-seconds", "2",
               "--job-cpu-seconds", "1", "--background-processes", "5",
               "--concurrent-runs", "3")  # fmt: skip
    request = request_from(forecast_args(*base, *machine))
    expected = replace(
        SMALL, resume_starts=1, cores=2, task_cpu_seconds=2.0, job_cpu_seconds=1.0,
        background_processes=5.0, concurrent_runs=3, eval_chips=64, train_chips=128,
    )  # fmt: skip
    assert request.base == expected
    text = render_text(request, report(request), each=False)
    assert "machine: 2 cores" in text and "resumes in a second task start" in text
    for flag, bad in (("--cores", "-3"), ("--concurrent-runs", "0"), ("--resume-starts", "x")):
        with pytest.raises(ForecastUsageError, match=flag):
            request_from(forecast_args(*base, flag, bad))
