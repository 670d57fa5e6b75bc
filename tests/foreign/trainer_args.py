"""What the two stand-in trainers of this folder share: the run's flags (which rcpflow's job
templates fill from the run's parameters, `deployment.RUN_TEMPLATE_FLAGS`) and the fixture's
skill curve, ``skill = skill_start + skill_per_step * N`` clipped to [0, 1]."""

from __future__ import annotations

import argparse

from rcpflow import recipe


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """--seed, --global-batch-size, --max-steps, --val-start-at, --division (all required) and
    the skill curve's --skill-start, --skill-per-step."""
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--val-start-at", type=int, required=True)
    p.add_argument("--division", choices=recipe.DIVISIONS, required=True)
    p.add_argument("--skill-start", type=float, default=0.2)
    p.add_argument("--skill-per-step", type=float, default=0.1)


def skill(step: int, start: float, per_step: float) -> float:
    return min(1.0, max(0.0, start + per_step * step))
