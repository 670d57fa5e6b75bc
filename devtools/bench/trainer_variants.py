"""What the trainer benches (`devtools.bench.tunix_bench`, `devtools.bench.maxtext_bench`) share:
three variants of one training (``plain``: no checkpoints; ``checkpoints``: the trainer's own
save every step; ``recorded``: the same plus rcpflow's recording) in interleaved blocks, round r
in an order rotated by r (`round_order`), their flags (`add_block_flags`), their step-time
ratios (`ratios`) and the rows of BENCHMARKS.md that report them (`ratio_rows`,
`step_time_rows`). Standard library only: MaxText's environment imports it too.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

VARIANTS = ("plain", "checkpoints", "recorded")


def round_order(r: int) -> tuple[str, ...]:
    """Round `r`'s order of the variants: rotated per round, so machine noise hits them alike."""
    return VARIANTS[r % 3 :] + VARIANTS[: r % 3]


def add_block_flags(ap: argparse.ArgumentParser, *, steps: int) -> None:
    """``--rounds``, ``--steps`` (default `steps`), ``--warmup`` and ``--output``."""
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--output", default="BENCHMARKS.md", help="markdown file of the section")


def check_block_flags(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit 2 (``ap.error``) unless two steps are timed after the warmup."""
    if args.steps < args.warmup + 2:
        ap.error("--steps must leave at least two timed steps after --warmup")


def ratios(med: Mapping[str, float]) -> dict[str, object]:
    """The median step times and their ratios, for the bench's result line."""
    return {
        "median_step_s": {v: round(m, 4) for v, m in med.items()},
        "checkpoints/plain": round(med["checkpoints"] / med["plain"], 3),
        "recorded/checkpoints": round(med["recorded"] / med["checkpoints"], 3),
        "recorded/plain": round(med["recorded"] / med["plain"], 3),
    }


def ratio_rows(
    trainer: str, med: Mapping[str, float], per_round: Sequence[float], save_meaning: str
) -> str:
    """The step-time rows of the section's ratio table (`save_meaning`: what `trainer`'s own
    checkpoint every step is), one line each."""
    rounds = ", ".join(f"{x:.2f}" for x in per_round)
    return f"""\
| step time, {trainer} checkpoint every step / none | {med["checkpoints"] / med["plain"]:.3f} | \
{save_meaning} |
| step time, recorded / {trainer} checkpoints | {med["recorded"] / med["checkpoints"]:.3f} | \
what rcpflow's recording adds (goal: at most 1.05) |
| step time, recorded / none | {med["recorded"] / med["plain"]:.3f} | both together |
| recorded / checkpoints, per round | {rounds} | \
its spread over the rounds: how much of the difference is noise |"""


def step_time_rows(trainer: str, med: Mapping[str, float], recording_s: float) -> str:
    """The step-time rows of the section's table of quantities, one line each."""
    return f"""\
| median step time, no checkpoints | {med["plain"] * 1e3:.1f} ms |
| median step time, {trainer} checkpoint every step | {med["checkpoints"] * 1e3:.1f} ms |
| median step time, checkpoints + rcpflow recording | {med["recorded"] * 1e3:.1f} ms |
| median time in the recording call per update | {recording_s * 1e3:.1f} ms |"""
