"""The `qwen35_397b_grpo` recipe of MLPerf Training 6.1.0, as data the trainer logs from.

The numbers mirror the official checker files in mlperf-logging
(`compliance_checker/training_6.1.0/{closed,open}_qwen35_397b_grpo.yaml`), which is what a log is
judged against; where the benchmark's plan and the checker differ (target `>=` vs `>`), the
checker wins.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

BENCHMARK = "qwen35_397b_grpo"
RULESET = "6.1.0"
TARGET_ACCURACY = 0.69
EVAL_SAMPLES = 251
GENERATIONS_PER_PROMPT = 16
MAX_SEQUENCE_LENGTH = 65536
INIT_CHECKPOINT_STEP = 0
PASS_K = 4
EVAL_ATTEMPTS_PER_INSTANCE = PASS_K
TRAIN_TEMPERATURE = 1.0
TRAIN_TOP_P = 1.0
EVAL_TEMPERATURE = 0.1
EVAL_TOP_P = 0.95
OPTIMIZER = "adamw"
ADAM_BETA_1 = 0.9
ADAM_BETA_2 = 0.999
ADAM_EPSILON = 1e-8
WEIGHT_DECAY = 0.0
WARMUP_STEPS = 0
LR_SCHEDULE = "constant"
REFERENCE_BATCH_SIZE = 256
# Bounds on what a run may state: far beyond any real run, far below 64 bits.
MAX_STEPS_LIMIT = 100_000
MAX_GLOBAL_BATCH_SIZE = 2**20  # x MAX_STEPS_LIMIT: samples_count stays far below 64 bits
MAX_SEED = 2**32 - 1  # what every trainer's RNG takes (JAX keys, numpy seeds)
EARLIEST_TIME_MS = 1_577_836_800_000  # 2020-01-01T00:00:00Z: no benchmark run is older
FUTURE_SLACK_MS = 86_400_000  # a clock a day ahead of this host's is a wrong clock

Division = Literal["closed", "open"]
DIVISIONS: tuple[Division, ...] = ("closed", "open")


# An open division's own optimizer numbers: finite, positive, bounded (nan or inf would be
# logged as the run's hyperparameters).
MAX_LEARNING_RATE = 1.0
MAX_CLIP_NORM = 1e6


def time_problem(time_ms: int, now_ms: int | None = None) -> str | None:
    """Why `time_ms` (epoch ms) cannot be a time of a run, or None: before 2020-01-01, or more
    than a day ahead of this host's clock."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    if time_ms < EARLIEST_TIME_MS:
        return f"{time_ms} is before 2020-01-01 ({EARLIEST_TIME_MS})"
    if time_ms > now + FUTURE_SLACK_MS:
        return f"{time_ms} is more than a day ahead of now ({now})"
    return None


def check_global_batch_size(global_batch_size: int) -> int:
    """`global_batch_size` if it is a positive multiple of the 16 generations per prompt, at most
    MAX_GLOBAL_BATCH_SIZE."""
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int):
        raise ValueError(f"global_batch_size must be an integer, got {global_batch_size!r}")
    if global_batch_size <= 0 or global_batch_size % GENERATIONS_PER_PROMPT:
        raise ValueError(
            f"global_batch_size must be a positive multiple of {GENERATIONS_PER_PROMPT} "
            f"(prompts x {GENERATIONS_PER_PROMPT} generations), got {global_batch_size}"
        )
    if global_batch_size > MAX_GLOBAL_BATCH_SIZE:
        raise ValueError(
            f"global_batch_size must be at most {MAX_GLOBAL_BATCH_SIZE}, got {global_batch_size}"
        )
    return global_batch_size


def val_start_at(global_batch_size: int, override: int | None = None) -> int:
    """First step whose checkpoint is evaluated: ``ceil(2.5 + 3840/gbs)``, or `override` if > 0."""
    if override is not None and override > 0:
        return int(override)
    if global_batch_size <= 0:
        raise ValueError(f"global_batch_size must be positive, got {global_batch_size}")
    return math.ceil(2.5 + 3840 / global_batch_size)


def closed_learning_rate(global_batch_size: int) -> float:
    return 1e-6 * (global_batch_size / REFERENCE_BATCH_SIZE) ** 0.5


def closed_gradient_clip_norm(global_batch_size: int) -> float:
    return 0.125 * (REFERENCE_BATCH_SIZE / global_batch_size) ** 0.5


@dataclass(frozen=True)
class Hyperparameters:
    """Everything the training section of the MLLOG states about the optimisation."""

    division: Division
    global_batch_size: int
    num_prompts_per_step: int
    num_generations_per_prompt: int
    learning_rate: float
    gradient_clip_norm: float
    adam_beta_1: float
    adam_beta_2: float
    adam_epsilon: float
    weight_decay: float
    warmup_steps: int
    lr_schedule: str
    train_temperature: float
    train_top_p: float
    eval_temperature: float
    eval_top_p: float
    max_sequence_length: int
    eval_samples: int
    init_checkpoint_step: int
    max_steps: int


def hyperparameters(
    division: Division,
    global_batch_size: int,
    max_steps: int,
    learning_rate: float | None = None,
    gradient_clip_norm: float | None = None,
) -> Hyperparameters:
    """The hyperparameters for a division.

    Closed division is the recipe exactly: an override that differs from it is refused rather
    than silently logged as something the checker would reject. Open division may choose its
    own learning rate and clip norm; the rest is pinned or kept at the recipe's values.
    """
    if division not in DIVISIONS:
        raise ValueError(f"division must be one of {DIVISIONS}, got {division!r}")
    check_global_batch_size(global_batch_size)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int):
        raise ValueError(f"max_steps must be an integer, got {max_steps!r}")
    if not 0 < max_steps <= MAX_STEPS_LIMIT:
        raise ValueError(f"max_steps must be in 1..{MAX_STEPS_LIMIT}, got {max_steps}")
    lr = closed_learning_rate(global_batch_size)
    clip = closed_gradient_clip_norm(global_batch_size)
    if division == "closed":
        for name, given, pinned in (
            ("learning_rate", learning_rate, lr),
            ("gradient_clip_norm", gradient_clip_norm, clip),
        ):
            if given is not None and abs(given - pinned) > 1e-12:
                raise ValueError(
                    f"closed division pins {name} to {pinned!r} at global_batch_size "
                    f"{global_batch_size}; got {given!r} (use division 'open' to change it)"
                )
    else:
        lr = lr if learning_rate is None else float(learning_rate)
        clip = clip if gradient_clip_norm is None else float(gradient_clip_norm)
        if not (math.isfinite(lr) and 0 < lr <= MAX_LEARNING_RATE):
            raise ValueError(f"learning_rate {lr!r} must be a number in (0, {MAX_LEARNING_RATE}]")
        if not (math.isfinite(clip) and 0 < clip <= MAX_CLIP_NORM):
            raise ValueError(
                f"gradient_clip_norm {clip!r} must be a number in (0, {MAX_CLIP_NORM:g}]"
            )
    return Hyperparameters(
        division=division,
        global_batch_size=global_batch_size,
        num_prompts_per_step=global_batch_size // GENERATIONS_PER_PROMPT,
        num_generations_per_prompt=GENERATIONS_PER_PROMPT,
        learning_rate=lr,
        gradient_clip_norm=clip,
        adam_beta_1=ADAM_BETA_1,
        adam_beta_2=ADAM_BETA_2,
        adam_epsilon=ADAM_EPSILON,
        weight_decay=WEIGHT_DECAY,
        warmup_steps=WARMUP_STEPS,
        lr_schedule=LR_SCHEDULE,
        train_temperature=TRAIN_TEMPERATURE,
        train_top_p=TRAIN_TOP_P,
        eval_temperature=EVAL_TEMPERATURE,
        eval_top_p=EVAL_TOP_P,
        max_sequence_length=MAX_SEQUENCE_LENGTH,
        eval_samples=EVAL_SAMPLES,
        init_checkpoint_step=INIT_CHECKPOINT_STEP,
        max_steps=max_steps,
    )


def trainer_run(
    division: Division, global_batch_size: int, max_steps: int, val_start_override: int | None
) -> tuple[Hyperparameters, int]:
    """The hyperparameters and validation start step of a trainer's run flags, if they describe
    a run that saves and evaluates at least one checkpoint; a ValueError names the flag."""
    if val_start_override is not None and val_start_override <= 0:
        raise ValueError(f"--val-start-at must be positive, got {val_start_override}")
    hp = hyperparameters(division, global_batch_size, max_steps)
    val_start = val_start_at(hp.global_batch_size, val_start_override)
    if val_start > hp.max_steps:
        raise ValueError(
            f"--max-steps {hp.max_steps} is below the validation start step {val_start}: "
            "no checkpoint would ever be saved or evaluated"
        )
    return hp, val_start
