"""The proportions bench's calibration of the forecast's machine model: from evaluations whose
phases were timed under a known load it recovers the model's parameters, and a row's
background is its runnable processes less its own phases and the sampler."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from devtools.bench.load_calibration import Phases, background, calibrate, phases, stretch


def timed(wait_end: float, runnable: int, *, fixed: float, cpu: float, job_cpu: float) -> Phases:
    """An evaluation of 17 s whose phases took what the model says at `runnable` on 2 cores."""
    s = max(1.0, runnable / 2)
    eval_start = wait_end + fixed + cpu * s
    queued = eval_start + 17.0 + job_cpu * s
    return Phases(wait_end, eval_start, queued, queued + fixed + cpu * s)


def test_the_parameters_that_timed_the_phases_are_recovered() -> None:
    measured, samples = [], []
    for i, runnable in enumerate((2, 4, 8, 12, 16)):  # each evaluation under its own load
        t0 = 100.0 * i
        measured.append(timed(t0, runnable, fixed=0.5, cpu=1.5, job_cpu=1.2))
        samples += [(t0 + k, 0.0, runnable) for k in range(100)]
    cal = calibrate(measured, samples, eval_s=17.0, poll_s=0.5, cores=2)
    assert cal.task_start_s == pytest.approx(0.5, abs=0.05)
    assert cal.task_cpu_s == pytest.approx(1.5, abs=0.05)
    assert cal.job_cpu_s == pytest.approx(1.2, abs=0.05)
    assert (cal.evaluations, cal.cores, cal.poll_s) == (5, 2, 0.5)


def test_no_parameter_is_negative() -> None:
    # phases shorter under more load (noise): not a negative CPU time, a constant
    measured = [Phases(0.0, 3.0, 20.0, 23.0), Phases(100.0, 101.0, 118.0, 119.0)]
    samples = [(float(t), 0.0, 2) for t in range(50)] + [
        (float(t), 0.0, 20) for t in range(100, 150)
    ]
    cal = calibrate(measured, samples, eval_s=17.0, poll_s=0.5, cores=2)
    assert cal.task_cpu_s == 0.0 and cal.task_start_s == pytest.approx(2.0)
    assert cal.job_cpu_s >= 0.0


def test_nothing_to_calibrate_from_is_an_error() -> None:
    with pytest.raises(ValueError, match="no evaluation phases"):
        calibrate([], [(0.0, 0.0, 1)], eval_s=17.0, poll_s=0.5, cores=2)


def test_a_phase_between_samples_takes_the_nearest() -> None:
    samples = [(0.0, 0.0, 2), (1.0, 0.0, 10), (2.0, 0.0, 4)]
    assert stretch(samples, 0.9, 1.2, 2) == 5.0  # the sample at 1.0 inside
    assert stretch(samples, 1.6, 1.9, 2) == 2.0  # none inside: 2.0 is nearest (4 / 2)
    assert stretch(samples, -5.0, -4.0, 8) == 1.0  # never below 1


def test_the_background_is_what_was_runnable_besides_the_rows_phases_and_the_sampler() -> None:
    # one evaluation starting over 0..2 s and resuming over 20..22 s; 7 runnable throughout
    p = Phases(0.0, 2.0, 20.0, 22.0)
    samples = [(float(t), 0.0, 7) for t in range(30)]
    # 6 in 26 of the 30 samples (7 less the sampler), 5 in the 4 during the phases: median 6
    assert background([p], samples) == 6.0
    busy = [(float(t), 0.0, 7) for t in (0, 1, 20, 21, 25)]  # mostly during the phases
    assert background([p], busy) == 5.0
    assert background([p], [(0.5, 0.0, 0)]) == 0.0  # never negative
    assert background([p], []) == 0.0


@dataclass
class Seed:
    tasks: list[dict[str, Any]] = field(default_factory=list)
    evaluations: list[list[float]] = field(default_factory=list)


def test_phases_come_from_the_task_instances_and_the_summaries() -> None:
    def ti(task: str, index: int, **dates: Any) -> dict[str, Any]:
        return {"task_id": f"evaluation.checkpoint.{task}", "map_index": index, "pid": 1,
                "queued_when": None, "end_date": None, **dates}  # fmt: skip

    seed = Seed(
        tasks=[
            ti("wait", 0, end_date=10.0),
            ti("evaluate", 0, queued_when=30.0),
            ti("wait", 1, end_date=12.0),
            ti("evaluate", 1, queued_when=None),  # no resume: skipped
            ti("wait", 2, end_date=14.0),
            {**ti("evaluate", 2, queued_when=40.0), "pid": None},  # no task process
        ],
        evaluations=[[18, 11.0, 31.0], [19, 13.0, 33.0], [20, 15.0, 41.0]],
    )
    assert phases([seed], val_start_at=18) == [Phases(10.0, 11.0, 30.0, 31.0)]
