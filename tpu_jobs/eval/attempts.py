"""The evaluation attempts every evaluator makes: which rows, their keys, their records.

Attempt a of instance i is sampled with fold_in(fold_in(PRNGKey(EVAL_SAMPLING_SEED), i), a) at
the validation temperature and top_p, and every sampler call of one evaluator has one shape
(`pad_rows`): XLA's results for a row can change in the last bits with the batch shape, so the
attempts depend neither on the shards nor on a rerun (docs/tpu_jobs.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rcpflow import recipe
from tpu_jobs import task
from tpu_jobs.eval.shards import Record

EVAL_SAMPLING_SEED = 0


def sampling_settings(batch_rows: int) -> dict[str, Any]:
    """Everything besides the weights that decides the attempts (part of a shard's identity)."""
    return {
        "seed": EVAL_SAMPLING_SEED,
        "temperature": recipe.EVAL_TEMPERATURE,
        "top_p": recipe.EVAL_TOP_P,
        "answer_length": task.ANSWER_LENGTH,
        "batch_rows": batch_rows,
    }


def attempt_rows(instances: Sequence[int]) -> list[tuple[int, int]]:
    """(instance, attempt) of every attempt at `instances`, sorted."""
    k = recipe.EVAL_ATTEMPTS_PER_INSTANCE
    return [(i, a) for i in sorted(instances) for a in range(k)]


def attempt_keys(rows: Sequence[tuple[int, int]]) -> jax.Array:
    """One PRNG key per (instance, attempt): a function of those two numbers only."""
    base = jax.random.PRNGKey(EVAL_SAMPLING_SEED)
    instances = jnp.asarray([i for i, _ in rows], dtype=jnp.uint32)
    attempts = jnp.asarray([a for _, a in rows], dtype=jnp.uint32)

    def key(i: jax.Array, a: jax.Array) -> jax.Array:
        return jax.random.fold_in(jax.random.fold_in(base, i), a)

    return jax.vmap(key)(instances, attempts)


def pad_rows(prompts: np.ndarray, keys: jax.Array, rows: int) -> tuple[np.ndarray, jax.Array]:
    """`prompts` and `keys` padded to `rows` with copies of the first row (their samples are
    dropped), so every sampler call has one shape."""
    pad = rows - prompts.shape[0]
    if pad <= 0:
        return prompts, keys
    return (
        np.concatenate([prompts, np.repeat(prompts[:1], pad, axis=0)]),
        jnp.concatenate([keys, jnp.repeat(keys[:1], pad, axis=0)]),
    )


def scored(
    rows: Sequence[tuple[int, int]], prompts: np.ndarray, completions: np.ndarray
) -> list[Record]:
    """One record per attempt (`rows[r]` answered `completions[r]` to `prompts[r]`)."""
    rewards = np.asarray(task.rewards(prompts, completions))
    correct = np.asarray(task.answers(prompts))
    records = []
    for r, (i, a) in enumerate(rows):
        reward = float(rewards[r])
        records.append(
            {
                "instance": i,
                "attempt": a,
                "prompt": prompts[r].tolist(),
                "completion": completions[r].tolist(),
                "answer": correct[r].tolist(),
                "reward": reward,
                "status": "resolved" if reward == 1.0 else "failed",
            }
        )
    return records
