"""The rehearsal jobs' shared flags: which profile, which curve, and the time scale.

``--profile`` (default: the shipped `profile.toml`) gives the seconds of a step and of an
evaluation; the jobs sleep them multiplied by ``--time-scale`` (default 1: the real
proportions at full length; 0: no waiting at all, for tests). ``--curve`` (the trainer's;
default: the shipped `curve.csv`) gives each step's pass@4 per seed. A file that cannot be used
is an argparse error naming the flag (exit 2).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from rcpflow.files.usererrors import describe
from rcpflow.planning.rehearsal import (
    JobProfile,
    PassCurve,
    RehearsalInputError,
    load_curve,
    load_profile,
)

HERE = Path(__file__).resolve().parent
DEFAULT_PROFILE = HERE / "profile.toml"
DEFAULT_CURVE = HERE / "curve.csv"


@dataclass(frozen=True)
class Timing:
    """A profile at a time scale: what the jobs actually wait."""

    profile: JobProfile
    scale: float

    @property
    def step_s(self) -> float:
        return self.profile.step_seconds * self.scale

    @property
    def eval_s(self) -> float:
        return self.profile.eval_seconds * self.scale


def add_timing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        default=str(DEFAULT_PROFILE),
        help="job profile TOML: step and evaluation seconds (default: the seed's figures)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiplies the profile's seconds (default 1; e.g. 0.02 for 1/50)",
    )


def timing_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Timing:
    if not (math.isfinite(args.time_scale) and args.time_scale >= 0):
        parser.error(f"--time-scale {args.time_scale} must be a number >= 0")
    try:
        profile = load_profile(args.profile)
    except (RehearsalInputError, OSError) as e:
        parser.error(f"--profile: {describe(e)}")
    return Timing(profile, args.time_scale)


def curve_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> PassCurve:
    try:
        return load_curve(args.curve)
    except (RehearsalInputError, OSError) as e:
        parser.error(f"--curve: {describe(e)}")
