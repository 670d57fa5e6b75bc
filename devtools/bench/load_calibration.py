"""The forecast's machine model (`rcpflow.planning.forecast`, ``cores`` > 0) calibrated from one
proportions row's measurements, and the background load of any row: what the proportions
section's forecast column is given.

Each evaluation of the row, from its task instances, its summary and the wait before it, is
three phases: the task start (its wait ended -> the evaluate task recorded the evaluation's
start: the scheduler's delay, the task process's interpreter, imports and DAG parse), the job
(that record -> the resume queued when the triggerer saw the job end: ``eval_seconds`` plus the
job's own start), and the resume (queued -> the summary imported in a second task process).
Each phase's CPU stretches by max(1, runnable / cores), runnable being the mean of the machine's
runnable processes sampled during the phase. Fitted once, by least squares with no negative
parameter: task start = fixed + cpu x stretch (start and resume phases together); job - its
evaluation = cpu x stretch.

A row's background: the machine's runnable processes once a second, less the evaluation
phases of the row in flight at that moment and the sampler itself; its median. It is what the
rest of the machine (other work, Airflow's own loops) added, which the forecast cannot
simulate, measured as the run_start offsets are.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Sample = tuple[float, float, int]  # s after the trigger, 1-minute load average, runnable


class MeasuredSeed(Protocol):
    """What a seed's run recorded (`devtools.bench.proportions_bench.SeedRun`)."""

    @property
    def tasks(self) -> list[dict[str, Any]]: ...
    @property
    def evaluations(self) -> list[list[float]]: ...


@dataclass(frozen=True)
class Phases:
    """One evaluation's three phases, in s after the trigger."""

    wait_end: float
    eval_start: float
    resume_queued: float
    eval_stop: float


@dataclass(frozen=True)
class Calibration:
    """The machine model's parameters as one row measured them."""

    task_start_s: float  # a task start's fixed part (the scheduler's delay)
    task_cpu_s: float  # a task start's CPU seconds
    job_cpu_s: float  # an evaluation job's CPU seconds beside its evaluation
    poll_s: float
    cores: int
    evaluations: int  # evaluations it was fitted on


def phases(seeds: Sequence[MeasuredSeed], val_start_at: int) -> list[Phases]:
    """Every evaluation with a summary, a wait that ended and a resume, of every seed."""
    found = []
    for seed in seeds:
        by_index = {(t["task_id"].rsplit(".", 1)[-1], t["map_index"]): t for t in seed.tasks}
        evaluated = {int(k): (a, b) for k, a, b in seed.evaluations}
        for (task, index), ti in by_index.items():
            wait = by_index.get(("wait", index))
            times = evaluated.get(val_start_at + index)
            if task != "evaluate" or ti["pid"] is None or wait is None or times is None:
                continue
            if wait["end_date"] is None or ti["queued_when"] is None:
                continue
            found.append(Phases(wait["end_date"], times[0], ti["queued_when"], times[1]))
    return found


def stretch(samples: Sequence[Sample], start: float, end: float, cores: int) -> float:
    """max(1, the mean runnable processes sampled in [start, end] / cores); the nearest sample
    where none falls inside (a phase shorter than the sampling)."""
    inside = [n for t, _, n in samples if start <= t <= end]
    if not inside:
        inside = [min(samples, key=lambda x: abs(x[0] - (start + end) / 2))[2]]
    return max(1.0, statistics.fmean(inside) / cores)


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """y = a + b x by least squares, neither negative (a line through 0, or a constant)."""
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    a = my - b * mx
    if a < 0:
        return 0.0, _through_zero(points)
    if b < 0:
        return max(0.0, my), 0.0
    return a, b


def _through_zero(points: Sequence[tuple[float, float]]) -> float:
    return max(0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points))


def calibrate(
    measured: Sequence[Phases],
    samples: Sequence[Sample],
    *,
    eval_s: float,
    poll_s: float,
    cores: int,
) -> Calibration:
    if not measured or not samples:
        raise ValueError("no evaluation phases or load samples to calibrate the forecast from")
    task: list[tuple[float, float]] = []
    job: list[tuple[float, float]] = []
    for p in measured:
        for start, end in ((p.wait_end, p.eval_start), (p.resume_queued, p.eval_stop)):
            task.append((stretch(samples, start, end, cores), end - start))
        job.append(
            (
                stretch(samples, p.eval_start, p.resume_queued, cores),
                p.resume_queued - p.eval_start - eval_s,
            )
        )
    fixed, cpu = _line(task)
    return Calibration(fixed, cpu, _through_zero(job), poll_s, cores, len(measured))


def background(measured: Sequence[Phases], samples: Sequence[Sample]) -> float:
    """The median runnable processes that were not the row's evaluation phases nor the
    sampler (at least 0)."""
    rest = []
    for t, _, runnable in samples:
        mine = sum(
            (p.wait_end <= t < p.eval_start) + (p.resume_queued <= t < p.eval_stop)
            for p in measured
        )
        rest.append(max(0, runnable - 1 - mine))
    return float(statistics.median(rest)) if rest else 0.0
