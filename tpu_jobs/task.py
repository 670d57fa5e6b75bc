"""The digit task every trainer and evaluator uses: prompts whose answer is exactly checkable.

A prompt is ``[BOS, d0, d1, d2, d3, SEP]`` (digits 0..9); the answer is ``(d3 + 1) mod 10`` as
one token, the reward exact match (1.0 or 0.0). The 251 held-out eval prompts are fixed; training
prompts are drawn per ``(seed, step)`` and never equal one. ``answers`` and ``rewards`` work on
numpy and ``jax.numpy`` arrays alike (scored inside a jitted step). Why this task:
docs/tpu_jobs.md.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from rcpflow.recipe import EVAL_SAMPLES

VOCAB_SIZE = 16
NUM_DIGITS = 4
KEY_POSITION = NUM_DIGITS - 1  # the key digit: the last one, next to SEP
BOS = 10
SEP = 11
PROMPT_LENGTH = NUM_DIGITS + 2
ANSWER_LENGTH = 1
EVAL_SEED = 20_251  # fixed: the eval set is the same for every training seed

_TRAIN_STREAM = 1  # separates training-prompt streams from the eval stream


def answers(prompts: Any) -> Any:
    """Correct answers ``(n, ANSWER_LENGTH)`` for prompts ``(n, PROMPT_LENGTH)`` (numpy or jax)."""
    key = prompts[:, 1 + KEY_POSITION : 2 + KEY_POSITION]
    return (key + 1) % 10


def rewards(prompts: Any, completions: Any) -> Any:
    """Exact-match reward per row: 1.0 if the completion is the answer, else 0.0."""
    return (completions == answers(prompts)).all(axis=-1).astype("float32")


def reward(prompt: tuple[int, ...], completion: tuple[int, ...]) -> float:
    """Reward of one completion; a completion of the wrong length scores 0."""
    if len(prompt) != PROMPT_LENGTH:
        raise ValueError(f"prompt must have {PROMPT_LENGTH} tokens, got {len(prompt)}: {prompt}")
    if len(completion) != ANSWER_LENGTH:
        return 0.0
    row = np.asarray([prompt], dtype=np.int32)
    return float(rewards(row, np.asarray([completion], dtype=np.int32))[0])


def _prompts_from_digits(digits: np.ndarray) -> np.ndarray:
    n = digits.shape[0]
    return np.concatenate([np.full((n, 1), BOS), digits, np.full((n, 1), SEP)], axis=1).astype(
        np.int32
    )


def _digit_code(digits: np.ndarray) -> np.ndarray:
    """Each row of ``(n, NUM_DIGITS)`` digits as one integer, for fast membership tests."""
    return digits @ 10 ** np.arange(NUM_DIGITS - 1, -1, -1)


@cache
def _eval_prompts() -> np.ndarray:
    rng = np.random.default_rng(EVAL_SEED)
    codes = rng.choice(10**NUM_DIGITS, size=EVAL_SAMPLES, replace=False)
    digits = (codes[:, None] // 10 ** np.arange(NUM_DIGITS - 1, -1, -1)) % 10
    prompts = _prompts_from_digits(digits)
    prompts.setflags(write=False)
    return prompts


@cache
def _eval_codes() -> frozenset[int]:
    return frozenset(int(c) for c in _digit_code(_eval_prompts()[:, 1 : 1 + NUM_DIGITS]))


def eval_prompts() -> np.ndarray:
    """The held-out prompts, ``(EVAL_SAMPLES, PROMPT_LENGTH)`` int32, read-only, fixed order."""
    return _eval_prompts()


def train_prompts(seed: int, step: int, num_prompts: int) -> np.ndarray:
    """Training prompts for one step, ``(num_prompts, PROMPT_LENGTH)`` int32.

    A pure function of ``(seed, step)``, so a resumed run sees the same prompts at the same step.
    Prompts equal to an eval prompt are redrawn.
    """
    if num_prompts <= 0:
        raise ValueError(f"num_prompts must be positive, got {num_prompts}")
    rng = np.random.default_rng([seed, step, _TRAIN_STREAM])
    held_out = _eval_codes()
    out = np.empty((0, NUM_DIGITS), dtype=np.int64)
    while out.shape[0] < num_prompts:
        draw = rng.integers(0, 10, size=(num_prompts, NUM_DIGITS))
        fresh = np.array([int(c) not in held_out for c in _digit_code(draw)], dtype=bool)
        out = np.concatenate([out, draw[fresh]])
    return _prompts_from_digits(out[:num_prompts])
