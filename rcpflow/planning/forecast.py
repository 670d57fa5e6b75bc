"""Time to verdict and chip-hours of a run, by an event simulation of the rules the run DAG
follows (`tasks.run.evaluation_group`, `tasks.run.evaluation_over_steps`, `tasks.run.stages`);
its command line, ``rcpflow forecast``, is `rcpflow.cli.forecast`.

Time 0 is ``run_start`` (the training job starts). Step k's update and checkpoint are done at
``k * step_seconds``; an evaluation takes ``eval_seconds`` on ``eval_chips``.

- ``after_training``: training runs to max_steps; its end is seen at the next poll (the train
  group waits on the job as a step's wait does); then (``load_manifest``, then the mapped
  ``evaluate``: two task starts) the steps are evaluated in step order, at most W at once.
- ``during_training``: the planned steps val_start_at..max_steps; a step's wait sees its
  checkpoint at the next poll, its evaluate starts one task start later, at most W at once in
  step order. At the verdict ``stop_if_decided`` (one task start) writes the stop request and
  the trainer stops after the step it is in.

Both: an evaluation slot that frees is taken one task start later by the lowest waiting step.
With ``resume_starts`` 1 an evaluate that defers while its job runs (every backend's does)
resumes in a second task process when the job ends, one more task start before its summary.

The machine the orchestration runs on (``cores`` > 0): a task start is ``task_start_seconds``
(the scheduler's own delay) plus ``task_cpu_seconds`` of CPU (a task process's interpreter,
imports and DAG parse), and an evaluation job adds ``job_cpu_seconds`` (its interpreter and
result) to its ``eval_seconds``. CPU seconds stretch, as a processor shared among the runnable
processes does, by max(1, runnable / cores) where runnable = ``background_processes`` (other
work) + ``concurrent_runs`` x the CPU phases (task starts, job starts) of this run in flight at
that moment, itself included: the runs of a submission start their tasks at the same moments, so
each of the others is counted as this one. The bench's measured latency growing with load is
this (BENCHMARKS.md, "Time to verdict at the benchmark's proportions"); at full scale the same
seconds are negligible beside a 1,700 s evaluation. ``cores`` 0 (the default): no CPU model.
A step above the passing one that starts after the pass skips (the gate); one already running
is wasted: cancelled at the pass (``cancel=True``, what the run DAG does), or with
``cancel=False`` it runs to its end. The verdict is when the passing step and every lower one
have their summaries.

Bounds (each refused in one usage line naming its flag, before any work): seconds are finite,
in [`SECONDS_MIN`, `SECONDS_MAX`] (step, evaluation; task start and poll may also be 0);
max_steps, W and passing steps in 1..`STEPS_MAX`; chips in 1..`CHIPS_MAX`; the global batch
size in 1..`BATCH_MAX`; and the whole request (schedules x W x passing steps x evaluated steps, with
``--recommend`` its searches) at most `WORK_MAX` simulated steps, so that any accepted request
answers within a second.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from rcpflow.verdict.schedule import SCHEDULES, EvalSchedule

# "reference": the MLCommons reference's own (NeMo-RL, ../shared/reference/nemo-rl.md): the
# deferred evaluator as a second srun in the training's allocation once training exits, one
# checkpoint at a time (W = 1), the training nodes held, idle, until the verdict; nothing
# evaluates on other chips. Named so that a NeMo-RL submitter sees what W and
# during_training would save in time to verdict and node-hours. The run DAG's schedules
# (`SCHEDULES`) are what --recommend and "both" are about.
Schedule = EvalSchedule | Literal["reference"]
NAMED_SCHEDULES: tuple[Schedule, ...] = (*SCHEDULES, "reference")
# --recommend: the smallest W whose time to verdict is within this factor of the best W's.
RECOMMEND_WITHIN = 1.10
Outcome = Literal["needed", "wasted", "cancelled"]
SECONDS_MAX = 1e7  # 115 days: more than any step, evaluation, task start or poll
SECONDS_MIN = 1e-3  # a millisecond: below it a division by it overflows (0 is "none")
STEPS_MAX = 10_000  # max_steps, W and passing steps
CHIPS_MAX = 10**6
BATCH_MAX = 10**9
CORES_MAX = 10_000  # the orchestrating machine's cores
RUNS_MAX = 1_000  # runs sharing it
PROCESSES_MAX = 1e6  # runnable processes of other work
WORK_MAX = 100_000  # simulated steps per request (a forecast counts 100 more): under a second


class ForecastUsageError(ValueError):
    """Inputs that describe no run; the message names the flag."""


@dataclass(frozen=True)
class Scenario:
    """One run to simulate."""

    step_seconds: float
    eval_seconds: float
    val_start_at: int
    max_steps: int
    passing_step: int
    schedule: Schedule
    window: int
    train_chips: int = 1
    eval_chips: int = 1
    task_start_seconds: float = 0.0  # a task's start after what it waits for
    poll_seconds: float = 0.0  # how often a waiting step reads the manifest (0: at once)
    cancel: bool = True  # higher steps' running evaluations are stopped at the pass
    # The machine's load (the module doc): defaults model none of it
    resume_starts: int = 0  # task starts after an evaluation's job ends (a deferred evaluate: 1)
    task_cpu_seconds: float = 0.0  # CPU seconds of one task start
    job_cpu_seconds: float = 0.0  # CPU seconds an evaluation job spends beside its evaluation
    cores: int = 0  # the orchestrating machine's cores (0: no CPU model)
    background_processes: float = 0.0  # runnable processes of other work on that machine
    concurrent_runs: int = 1  # runs sharing that machine at once (a submission's seeds)

    def __post_init__(self) -> None:
        for flag, value in (
            ("--step-seconds", self.step_seconds),
            ("--eval-seconds", self.eval_seconds),
        ):
            if not (math.isfinite(value) and SECONDS_MIN <= value <= SECONDS_MAX):
                raise ForecastUsageError(
                    f"{flag} {value} must be a number of seconds in "
                    f"[{SECONDS_MIN:g}, {SECONDS_MAX:g}]"
                )
        for flag, value in (
            ("--task-start-seconds", self.task_start_seconds),
            ("--poll-seconds", self.poll_seconds),
            ("--task-cpu-seconds", self.task_cpu_seconds),
            ("--job-cpu-seconds", self.job_cpu_seconds),
        ):
            if not (math.isfinite(value) and (value == 0 or SECONDS_MIN <= value <= SECONDS_MAX)):
                raise ForecastUsageError(
                    f"{flag} {value} must be 0 or a number of seconds in "
                    f"[{SECONDS_MIN:g}, {SECONDS_MAX:g}]"
                )
        for flag, count, most in (
            ("--window", self.window, STEPS_MAX),
            ("--train-chips", self.train_chips, CHIPS_MAX),
            ("--eval-chips", self.eval_chips, CHIPS_MAX),
            ("--max-steps", self.max_steps, STEPS_MAX),
            ("--concurrent-runs", self.concurrent_runs, RUNS_MAX),
        ):
            if count < 1:
                raise ForecastUsageError(f"{flag} {count} must be at least 1")
            if count > most:
                raise ForecastUsageError(f"{flag} {count} must be at most {most}")
        for flag, count, most in (
            ("--resume-starts", self.resume_starts, 1),
            ("--cores", self.cores, CORES_MAX),
        ):
            if not 0 <= count <= most:
                raise ForecastUsageError(f"{flag} {count} must be in 0..{most}")
        if not (
            math.isfinite(self.background_processes)
            and 0 <= self.background_processes <= PROCESSES_MAX
        ):
            raise ForecastUsageError(
                f"--background-processes {self.background_processes} must be a number in "
                f"[0, {PROCESSES_MAX:g}]"
            )
        if not 1 <= self.val_start_at <= self.max_steps:
            raise ForecastUsageError(
                f"--val-start-at {self.val_start_at} must be in 1..--max-steps {self.max_steps}"
            )
        if not self.val_start_at <= self.passing_step <= self.max_steps:
            raise ForecastUsageError(
                f"--passing-step {self.passing_step} must be in --val-start-at "
                f"{self.val_start_at}..--max-steps {self.max_steps}"
            )
        if self.schedule not in NAMED_SCHEDULES:
            raise ForecastUsageError(
                f"--schedule {self.schedule!r}: one of {', '.join(NAMED_SCHEDULES)}"
            )
        if self.schedule == "reference" and self.window != 1:
            raise ForecastUsageError(f"--window {self.window}: the reference schedule is W = 1")


@dataclass(frozen=True)
class Evaluation:
    step: int
    start_s: float
    end_s: float
    outcome: Outcome  # needed: up to the passing step; above it wasted (ran out) or cancelled


@dataclass(frozen=True)
class Forecast:
    scenario: Scenario
    verdict_s: float  # from run_start
    steps_trained: int
    training_end_s: float
    evaluations: tuple[Evaluation, ...]

    @property
    def verdict_ratio(self) -> float:
        """Verdict over the ideal: the passing checkpoint evaluated the moment it exists."""
        s = self.scenario
        return self.verdict_s / (s.passing_step * s.step_seconds + s.eval_seconds)

    @property
    def wasted(self) -> int:
        """Evaluations of steps above the passing one that started (ran out or cancelled)."""
        return sum(e.outcome != "needed" for e in self.evaluations)

    @property
    def eval_chip_hours(self) -> float:
        if self.scenario.schedule == "reference":
            return 0.0  # on the training's allocation: in train_chip_hours
        busy = sum(e.end_s - e.start_s for e in self.evaluations)
        return busy * self.scenario.eval_chips / 3600

    @property
    def wasted_chip_hours(self) -> float:
        busy = sum(e.end_s - e.start_s for e in self.evaluations if e.outcome != "needed")
        return busy * self.scenario.eval_chips / 3600

    @property
    def train_chip_hours(self) -> float:
        if self.scenario.schedule == "reference":  # the allocation is held to the verdict
            return self.run_end_s * self.scenario.train_chips / 3600
        return self.training_end_s * self.scenario.train_chips / 3600

    @property
    def run_end_s(self) -> float:
        """When the last job of the run ends (training, or an evaluation left running)."""
        return max([self.training_end_s, *(e.end_s for e in self.evaluations)])

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self.scenario),
            "verdict_s": self.verdict_s,
            "verdict_h": self.verdict_s / 3600,
            "verdict_ratio": self.verdict_ratio,
            "steps_trained": self.steps_trained,
            "training_end_s": self.training_end_s,
            "run_end_s": self.run_end_s,
            "evaluations": len(self.evaluations),
            "wasted": self.wasted,
            "eval_chip_hours": self.eval_chip_hours,
            "wasted_chip_hours": self.wasted_chip_hours,
            "train_chip_hours": self.train_chip_hours,
        }


def _seen(t: float, poll_s: float) -> float:
    """The first poll at or after `t` (polls every `poll_s` from run_start)."""
    if poll_s <= 0:
        return t
    return math.ceil(t / poll_s - 1e-9) * poll_s


class _Machine:
    """The CPU phases of a simulated run in flight (the module doc's machine model): how long
    one that starts at a moment takes."""

    def __init__(self, s: Scenario) -> None:
        self.s = s
        self.phases: list[tuple[float, float]] = []  # (start, end) of each phase placed

    def forget_before(self, t: float) -> None:
        """Phases that end by `t` can load no later query (queries come at `t` or after)."""
        if self.s.cores:
            self.phases = [p for p in self.phases if p[1] > t]

    def take(self, t: float, fixed: float, cpu: float) -> float:
        """The end of a phase that starts at `t`: `fixed` seconds plus `cpu` CPU seconds,
        stretched by the processes runnable at `t` over the cores."""
        s = self.s
        if not s.cores or cpu == 0:
            return t + fixed + cpu
        mine = 1 + sum(a <= t < b for a, b in self.phases)
        runnable = s.background_processes + s.concurrent_runs * mine
        end = t + fixed + cpu * max(1.0, runnable / s.cores)
        self.phases.append((t, end))
        return end


def simulate(s: Scenario) -> Forecast:
    first, last, p = s.val_start_at, s.max_steps, s.passing_step
    machine = _Machine(s)

    def task_start(t: float) -> float:
        """When a task queued at `t` runs."""
        return machine.take(t, s.task_start_seconds, s.task_cpu_seconds)

    if s.schedule == "reference":
        # the second srun of the same allocation, right after training exits: no poll, no task
        training_over = last * s.step_seconds
    else:
        # after: the train group's end, seen at a poll; then load_manifest and the mapped evaluate
        training_over = task_start(_seen(last * s.step_seconds, s.poll_seconds))
    during = s.schedule == "during_training"

    def ready(k: int) -> float:
        """When step k's evaluate is queued (a slot free)."""
        return _seen(k * s.step_seconds, s.poll_seconds) if during else training_over

    reference = s.schedule == "reference"
    free: list[float] = [-math.inf] * s.window  # when each evaluation slot frees
    passed_at: float | None = None
    evaluations: list[Evaluation] = []
    for k in range(first, last + 1):
        slot = heapq.heappop(free)
        machine.forget_before(ready(k))
        if reference:  # as before the machine model: a slot's next evaluation one start later
            start = ready(k) if slot == -math.inf else max(ready(k), slot + s.task_start_seconds)
        else:
            start = task_start(max(ready(k), slot))
        if passed_at is not None and start >= passed_at:
            break  # the gate skips it, and every later step (they start no earlier)
        end = machine.take(start, s.eval_seconds, 0.0 if reference else s.job_cpu_seconds)
        for _ in range(0 if reference else s.resume_starts):
            end = task_start(end)
        outcome: Outcome = "needed"
        if k == p:
            passed_at = end
        elif k > p:
            assert passed_at is not None  # p was simulated before k
            outcome = "cancelled" if s.cancel else "wasted"
            if s.cancel:
                end = passed_at
        evaluations.append(Evaluation(k, start, end, outcome))
        heapq.heappush(free, end)
    verdict = max(e.end_s for e in evaluations if e.step <= p)
    if s.schedule != "during_training":
        steps = last
    else:
        # stop_if_decided writes the request; the trainer ends the step it is in
        request = task_start(verdict)
        steps = min(last, max(p, math.ceil(request / s.step_seconds - 1e-9)))
    return Forecast(
        scenario=s,
        verdict_s=verdict,
        steps_trained=steps,
        training_end_s=steps * s.step_seconds,
        evaluations=tuple(evaluations),
    )


@dataclass(frozen=True)
class Recommendation:
    schedule: EvalSchedule
    window: int
    verdict_s: float  # mean over the passing steps
    eval_chip_hours: float  # mean over the passing steps
    best_window: int
    best_verdict_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean_forecast(base: Scenario, passing: Sequence[int], **change: Any) -> list[Forecast]:
    return [simulate(replace(base, passing_step=p, **change)) for p in passing]


def recommend(base: Scenario, passing: Sequence[int], schedule: EvalSchedule) -> Recommendation:
    """The smallest W whose mean time to verdict over `passing` is within 10 % of the best W's
    (W up to one slot per evaluated step, beyond which nothing changes). A larger W is never
    slower (each step starts no later), so both are found by bisection: a bounded search."""
    means: dict[int, tuple[float, float]] = {}

    def mean(window: int) -> tuple[float, float]:
        if window not in means:
            runs = _mean_forecast(base, passing, schedule=schedule, window=window)
            means[window] = (
                statistics.fmean(f.verdict_s for f in runs),
                statistics.fmean(f.eval_chip_hours for f in runs),
            )
        return means[window]

    def smallest(within: float) -> int:
        low, high = 1, top  # mean(high) <= within
        while low < high:
            mid = (low + high) // 2
            if mean(mid)[0] <= within:
                high = mid
            else:
                low = mid + 1
        return low

    top = base.max_steps - base.val_start_at + 1
    best = mean(top)[0]
    best_window = smallest(best)
    best = mean(best_window)[0]
    window = smallest(best * RECOMMEND_WITHIN)
    return Recommendation(
        schedule=schedule,
        window=window,
        verdict_s=means[window][0],
        eval_chip_hours=means[window][1],
        best_window=best_window,
        best_verdict_s=best,
    )


def recommend_cost(base: Scenario, passing: Sequence[int]) -> int:
    """Simulated steps `recommend` may take over both schedules (its bound)."""
    top = base.max_steps - base.val_start_at + 1
    return len(SCHEDULES) * len(passing) * top * (2 * top.bit_length() + 1)
