"""The command line every training job shares: the run flags and their checks (`RunConfig`,
`add_run_flags`, `parse_run_args`), its progress lines (`say`), the recorder of a trainer that
records around its own loop (`run_recorder`) and the `main` tail (`run_job`).

A trainer adds its own flags and fields; the exit codes are `tpu_jobs.rcp.job_errors`'.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import jax

from rcpflow import recipe
from rcpflow.records.mllog import SystemInfo, require_mlperf_logging
from rcpflow.trainer.recorder import TrainingRecorder
from tpu_jobs.rcp import job_errors

DEFAULT_GLOBAL_BATCH_SIZE = 256
DEFAULT_DIVISION: recipe.Division = "open"


@dataclass(frozen=True)
class RunConfig:
    """The settings of one training run that every trainer takes (a trainer subclasses it)."""

    # The trainer's learning rate in open division when --learning-rate is not given.
    OPEN_LEARNING_RATE: ClassVar[float]

    run_dir: str
    seed: int
    global_batch_size: int = DEFAULT_GLOBAL_BATCH_SIZE
    max_steps: int = 50
    val_start_at: int | None = None  # None: the recipe's
    division: recipe.Division = DEFAULT_DIVISION
    learning_rate: float | None = None  # None: the division's default
    rcp_logging: bool = True

    def hyperparameters(self) -> recipe.Hyperparameters:
        """The recipe's hyperparameters; open division defaults to `OPEN_LEARNING_RATE`."""
        lr = self.learning_rate
        if self.division == "open" and lr is None:
            lr = self.OPEN_LEARNING_RATE
        return recipe.hyperparameters(
            self.division, self.global_batch_size, self.max_steps, learning_rate=lr
        )


@dataclass(frozen=True)
class TrainResult:
    first_step: int  # 1 on a fresh run, newest checkpoint + 1 after a resume
    last_step: int
    resumed_from: int | None
    mean_rewards: tuple[float, ...] = ()  # per update this process ran, where the loop sees them


C = TypeVar("C", bound=RunConfig)


def run_recorder(config: RunConfig, hp: recipe.Hyperparameters, val_start: int) -> TrainingRecorder:
    """The run's recorder, for a trainer whose update consumes the whole global batch at once
    (its micro-batch size)."""
    return TrainingRecorder(
        config.run_dir,
        seed=config.seed,
        hyperparameters=hp,
        val_start_at=val_start,
        system=SystemInfo(micro_batch_size=hp.global_batch_size),
        rcp_logging=config.rcp_logging,
    )


def say(record: dict[str, object]) -> None:
    """One progress line on stdout (JSON), in one write: the processes of a local multi-process
    job share one pipe, and print's separate write of the newline could interleave there."""
    sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()


def start_event(
    hp: recipe.Hyperparameters, val_start: int, resumed_from: int | None
) -> dict[str, object]:
    """The fields of the ``start`` line every trainer prints (a trainer may add its own)."""
    return {
        "event": "start",
        "resumed_from": resumed_from,
        "division": hp.division,
        "learning_rate": hp.learning_rate,
        "gradient_clip_norm": hp.gradient_clip_norm,
        "global_batch_size": hp.global_batch_size,
        "val_start_at": val_start,
        "max_steps": hp.max_steps,
        "devices": [str(d) for d in jax.devices()],
    }


def add_run_flags(parser: argparse.ArgumentParser, config_type: type[RunConfig]) -> None:
    """The `RunConfig` flags, with `config_type`'s defaults."""
    defaults = config_type.__dataclass_fields__
    parser.add_argument("--run-dir", required=True, help="local folder or gs://bucket/prefix")
    parser.add_argument(
        "--seed", type=int, required=True, help="same seed, same trajectory (also after a resume)"
    )
    parser.add_argument(
        "--global-batch-size",
        type=int,
        default=defaults["global_batch_size"].default,
        help="generations per step, prompts x 16 (default %(default)s)",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=defaults["max_steps"].default,
        help="optimizer updates (default %(default)s)",
    )
    parser.add_argument(
        "--val-start-at",
        type=int,
        default=None,
        help="first checkpointed step (default: the recipe's, ceil(2.5+3840/gbs))",
    )
    parser.add_argument(
        "--division",
        choices=recipe.DIVISIONS,
        default=DEFAULT_DIVISION,
        help="closed runs the recipe exactly (lr 1e-6 at gbs 256, on which the toy does not "
        "learn); open (default) allows the trainer's learning rate",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help=f"open division only (default {config_type.OPEN_LEARNING_RATE}); closed uses the "
        "recipe's",
    )
    parser.add_argument(
        "--rcp-logging",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write the MLLOG training section (default on)",
    )


def run_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The `RunConfig` fields of parsed `add_run_flags` arguments."""
    return {
        "run_dir": args.run_dir,
        "seed": args.seed,
        "global_batch_size": args.global_batch_size,
        "max_steps": args.max_steps,
        "val_start_at": args.val_start_at,
        "division": args.division,
        "learning_rate": args.learning_rate,
        "rcp_logging": args.rcp_logging,
    }


def parse_run_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    build: Callable[[argparse.Namespace], C],
) -> C:
    """Parse, build the config (`build` may call ``parser.error``), and check that the flags
    describe a run that saves and evaluates at least one checkpoint; bad flags exit 2."""
    args = parser.parse_args(argv)
    if args.val_start_at is not None and args.val_start_at <= 0:
        parser.error(f"--val-start-at must be positive, got {args.val_start_at}")
    config = build(args)
    try:
        hp = config.hyperparameters()
    except ValueError as e:
        parser.error(str(e))
    val_start = recipe.val_start_at(hp.global_batch_size, config.val_start_at)
    if val_start > hp.max_steps:
        parser.error(
            f"--max-steps {hp.max_steps} is below the validation start step {val_start}: "
            "no checkpoint would ever be saved or evaluated"
        )
    return config


def run_job(prog: str, config: C, train: Callable[[C], TrainResult]) -> int:
    """The end of a trainer's `main`: train, then the ``done`` line and exit 0, or a user
    error's one line and its exit code (`job_errors`)."""
    if config.rcp_logging:
        require_mlperf_logging()
    started = time.monotonic()
    try:
        result = train(config)
    except job_errors.USER_ERRORS as e:
        return job_errors.report(prog, e)
    say(
        {
            "event": "done",
            "first_step": result.first_step,
            "last_step": result.last_step,
            "resumed_from": result.resumed_from,
            "wall_s": round(time.monotonic() - started, 2),
        }
    )
    return 0
