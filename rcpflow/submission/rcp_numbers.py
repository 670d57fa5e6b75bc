"""The RCP checker's numbers for a submission, computed by the official checker's own code.

`rcp_numbers` takes each seed's samples to converge (the ``samples_count`` of a successful
``run_stop``; None: did not converge) and asks ``mlperf_logging.rcp_checker``'s `RCP_Checker`
for the reference record of the batch size (found, or interpolated between its neighbours, as
the checker does), its mean and stdev and the minimum submission mean it accepts; the
submission's mean is the checker's olympic mean (fastest and slowest run dropped). The verdict
stays the checker's (its persisted verdict); these numbers say why, in one sentence.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rcpflow import recipe

USAGE = "training"
NOT_CONVERGED = 1e9  # what the checker counts for a run that did not converge


@dataclass(frozen=True)
class RcpNumbers:
    global_batch_size: int
    record: str  # which reference record judged it: found, interpolated, or none
    reference_mean: float | None  # samples, the reference runs' olympic mean
    reference_stdev: float | None
    min_allowed: float | None  # the smallest submission mean the checker accepts
    samples: tuple[tuple[int, int | None], ...]  # (seed, samples to converge; None: did not)
    scored_seeds: tuple[int, ...]  # the seeds the mean is taken over (olympic)
    dropped_seeds: tuple[int, ...]  # the fastest and the slowest
    submission_mean: float | None  # None: too many runs did not converge
    passes: bool
    reason: str


def _checker() -> Any:
    from mlperf_logging.rcp_checker.rcp_checker import RCP_Checker

    # The checker logs its records at INFO through the root logger; keep them out of ours.
    logging.getLogger().disabled, was = True, logging.getLogger().disabled
    try:
        return RCP_Checker(USAGE, recipe.RULESET, recipe.BENCHMARK, False)
    finally:
        logging.getLogger().disabled = was


def _record(checker: Any, bs: int) -> tuple[str, dict[str, Any] | None]:
    """The record the checker judges batch size `bs` by (pruned RCPs, its default pass)."""
    found = checker._find_rcp(bs, "pruned_rcps")
    if found is not None:
        return f"reference RCP of global_batch_size {bs}", found
    low = checker._find_top_min_rcp(bs, "pruned_rcps")
    high = checker._find_bottom_max_rcp(bs, "pruned_rcps")
    if low is not None and high is not None:
        _, record = checker._create_interp_rcp(bs, low, high)
        return f"interpolated between global_batch_size {low['BS']} and {high['BS']}", record
    if low is None and high is not None:
        smallest = checker._find_min_rcp("pruned_rcps")
        return f"the smallest reference, global_batch_size {smallest['BS']}", smallest
    return f"no reference RCP for global_batch_size {bs}", None


def rcp_numbers(samples: Mapping[int, int | None], global_batch_size: int) -> RcpNumbers:
    """The checker's numbers for these seeds' samples to converge at this batch size."""
    ordered = sorted(
        samples.items(), key=lambda kv: (NOT_CONVERGED if kv[1] is None else kv[1], kv[0])
    )
    failed = sum(v is None for _, v in ordered)
    cut = 1 if len(ordered) > 2 else 0
    scored = ordered[cut : len(ordered) - cut]
    dropped = ordered[:cut] + ordered[len(ordered) - cut :]
    name, record = _record(_checker(), global_batch_size)
    mean = None
    if failed <= 1 and scored:
        mean = sum(NOT_CONVERGED if v is None else v for _, v in scored) / len(scored)
    ref_mean = stdev = minimum = None
    if record is not None:
        ref_mean, stdev = float(record["RCP Mean"]), float(record["RCP Stdev"])
        minimum = ref_mean / float(record["Max Speedup"])  # the checker's own comparison
    if failed > 1:
        passes, reason = (
            False,
            f"fails: {failed} of {len(ordered)} runs did not converge (at most 1 may)",
        )
    elif minimum is None:
        passes, reason = False, f"fails: {name}"
    elif mean is not None and mean >= minimum:
        passes = True
        faster = (
            " (faster than the reference mean: the score is normalized)"
            if ref_mean and mean < ref_mean
            else ""
        )
        reason = (
            f"passes: the submission's mean {mean:.0f} samples is at least the minimum "
            f"allowed {minimum:.0f}{faster}"
        )
    else:
        passes = False
        reason = (
            f"fails: the submission's mean {mean:.0f} samples is below the minimum allowed "
            f"{minimum:.0f}"
        )
    return RcpNumbers(
        global_batch_size=global_batch_size,
        record=name,
        reference_mean=ref_mean,
        reference_stdev=stdev,
        min_allowed=minimum,
        samples=tuple(sorted(samples.items())),
        scored_seeds=tuple(sorted(s for s, _ in scored)),
        dropped_seeds=tuple(sorted(s for s, _ in dropped)),
        submission_mean=mean,
        passes=passes,
        reason=reason,
    )
