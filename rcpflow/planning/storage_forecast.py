"""The checkpoint storage a forecast run costs, with and without retention.

From a `rcpflow.planning.forecast.Forecast` (when each checkpoint is written, when each
evaluation ends, the verdict, training's end) and the checkpoint sizes: the peak bytes and
checkpoints on storage, the bytes written, and the storage-hours (TB x hours up to the run's
end, the last job's). Without retention nothing is deleted (rcpflow's default). With it, the
rule of `rcpflow.retention.rule` as the run DAG would apply it as soon as it may, with
``--while-training --settled``: a checkpoint below the passing step goes when its evaluation
ends, the passing one stays, one above it whose evaluation ran out (persisting its summary) goes
at the verdict (or when that evaluation ends, if later), one above it without a summary (its
evaluation stopped at the verdict, or never started) when the run is settled: training ended and
no evaluation running (or when written, if later); a full state's ``train_state/`` goes when a
newer full state is written or training ends. With no retention lag that is the least storage
the rule allows; the defaults (nothing deleted while training runs) keep more. A retention lag
(``--retention-lag-s``, 0 to `SECONDS_MAX`) puts each of those deletions that many seconds after
the moment the rule allows it: the run DAG's path from an evaluation's end (or the verdict) to
the deletion (the trigger's poll, the evaluate task's resume, which deletes before it ends;
docs/retention.md, "The storage forecast"). A deletion that would fall after the run's end is
not counted (the storage stays to the end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rcpflow.planning.forecast import SECONDS_MAX, STEPS_MAX, Forecast, ForecastUsageError

# bf16 weights; fp32 Adam moments and master weights (docs/tpu_jobs.md: 0.8 TB and 3-5 TB for
# Qwen3.5-397B).
WEIGHT_BYTES_PER_PARAM = 2
STATE_BYTES_PER_PARAM = 12
TB = 1e12
SIZE_TB_MAX = 1e6  # an exabyte: more than any checkpoint
PARAMS_B_MAX = 1e6  # a quadrillion parameters


@dataclass(frozen=True)
class CheckpointSizes:
    """One checkpoint's weights, and the training state a full-state save adds, in TB; every
    `full_every`-th checkpointed step from the validation start is a full-state save."""

    weights_tb: float
    full_state_tb: float = 0.0
    full_every: int = 1

    def __post_init__(self) -> None:
        for flag, value in (
            ("--weights-tb", self.weights_tb),
            ("--full-state-tb", self.full_state_tb),
        ):
            if not (math.isfinite(value) and 0 <= value <= SIZE_TB_MAX):
                raise ForecastUsageError(f"{flag} {value} must be a size in TB in [0, 1e6]")
        if not 1 <= self.full_every <= STEPS_MAX:
            raise ForecastUsageError(
                f"--full-state-every {self.full_every} must be in 1..{STEPS_MAX}"
            )


def sizes_from_model(params_billions: float, full_every: int = 1) -> CheckpointSizes:
    """The sizes of a model of `params_billions` parameters: bf16 weights, fp32 optimizer
    state and master weights."""
    if not (math.isfinite(params_billions) and 0 < params_billions <= PARAMS_B_MAX):
        raise ForecastUsageError(
            f"--model-params-b {params_billions} must be in (0, {PARAMS_B_MAX:g}]"
        )
    params = params_billions * 1e9
    return CheckpointSizes(
        params * WEIGHT_BYTES_PER_PARAM / TB, params * STATE_BYTES_PER_PARAM / TB, full_every
    )


def checked_lag(seconds: float) -> float:
    """`seconds` as a retention lag: finite, in [0, `SECONDS_MAX`]; ForecastUsageError naming
    ``--retention-lag-s`` otherwise."""
    if not (math.isfinite(seconds) and 0 <= seconds <= SECONDS_MAX):
        raise ForecastUsageError(
            f"--retention-lag-s {seconds} must be seconds in [0, {SECONDS_MAX:g}]"
        )
    return seconds


@dataclass(frozen=True)
class StorageForecast:
    peak_tb: float
    peak_checkpoints: int
    written_tb: float
    tb_hours: float  # up to the run's end


def storage(
    f: Forecast, sizes: CheckpointSizes, retention: bool, lag_s: float = 0.0
) -> StorageForecast:
    """The storage of the run `f` forecasts; with retention, each deletion `lag_s` seconds after
    the rule allows it (`checked_lag`)."""
    lag = checked_lag(lag_s)
    s = f.scenario
    horizon = max(f.run_end_s, f.verdict_s, f.training_end_s)
    ends = {e.step: e.end_s for e in f.evaluations}
    # above the passing step, the evaluations that ran out and persisted their summaries
    summarized = {
        e.step for e in f.evaluations if e.step > s.passing_step and e.outcome == "wasted"
    }
    first, last, p = s.val_start_at, f.steps_trained, s.passing_step
    full = [k for k in range(first, last + 1) if (k - first) % sizes.full_every == 0]
    # (time, order, TB, checkpoints): at one time writes come first (the peak counts both)
    events: list[tuple[float, int, float, int]] = []
    for k in range(first, last + 1):
        written = k * s.step_seconds
        events.append((written, 0, sizes.weights_tb, 1))
        gone = math.inf
        if retention and k < p:
            gone = ends[k]
        elif retention and k in summarized:
            gone = max(written, f.verdict_s, ends[k])
        elif retention and k > p:
            # no summary (stopped at the verdict, or never evaluated): "maybe being evaluated"
            # until the run is settled, once training has ended and no evaluation runs (the
            # run DAG's final retention task)
            gone = max(written, f.run_end_s)
        if k in full and sizes.full_state_tb:
            later = [j for j in full if j > k]
            # the newest full state while training: kept whole (a resume needs it)
            superseded = min(later[0] * s.step_seconds if later else math.inf, f.training_end_s)
            gone = max(gone, superseded) if retention else gone
            events.append((written, 0, sizes.full_state_tb, 0))
            if retention:
                events.append((min(superseded, gone) + lag, 1, -sizes.full_state_tb, 0))
        events.append((gone + lag, 1, -sizes.weights_tb, -1))
    events.sort()
    tb = peak = tb_seconds = 0.0
    count = peak_count = 0
    written_tb = sum(d for _, order, d, _ in events if order == 0)
    before = 0.0
    for t, _, delta, dcount in events:
        if t > horizon:
            break
        tb_seconds += tb * (t - before)
        before = t
        tb, count = tb + delta, count + dcount
        peak, peak_count = max(peak, tb), max(peak_count, count)
    tb_seconds += tb * (horizon - before)
    return StorageForecast(peak, peak_count, written_tb, tb_seconds / 3600)
