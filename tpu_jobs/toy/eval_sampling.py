"""Evaluation attempts: the 4 samples per instance at the validation temperature and top_p.

Attempt a of instance i is sampled with fold_in(fold_in(PRNGKey(EVAL_SAMPLING_SEED), i), a), and
every sampler call has the same shape (`EVAL_BATCH_ROWS` rows, a short last batch padded),
because XLA's results for a row can change in the last bits with the batch shape (measured on
CPU: up to 5e-7 in the logits between a 1004-row and a 336-row batch). So the attempts do not
depend on how the instances are split into shards, and a rerun gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rcpflow import recipe
from tpu_jobs import task
from tpu_jobs.eval_shards import Record
from tpu_jobs.model import ModelConfig, unscan_params
from tpu_jobs.sampling import LogitsFn, sample_tokens, unscanned_logits_fn

EVAL_SAMPLING_SEED = 0
# Rows (instance, attempt) per sampler call; a multiple of the attempts per instance.
EVAL_BATCH_ROWS = 256


def sampling_settings() -> dict[str, Any]:
    """Everything besides the weights that decides the attempts (part of a shard's identity)."""
    return {
        "seed": EVAL_SAMPLING_SEED,
        "temperature": recipe.EVAL_TEMPERATURE,
        "top_p": recipe.EVAL_TOP_P,
        "answer_length": task.ANSWER_LENGTH,
        "batch_rows": EVAL_BATCH_ROWS,
    }


def attempt_keys(rows: Sequence[tuple[int, int]]) -> jax.Array:
    """One PRNG key per (instance, attempt): a function of those two numbers only."""
    base = jax.random.PRNGKey(EVAL_SAMPLING_SEED)
    instances = jnp.asarray([i for i, _ in rows], dtype=jnp.uint32)
    attempts = jnp.asarray([a for _, a in rows], dtype=jnp.uint32)

    def key(i: jax.Array, a: jax.Array) -> jax.Array:
        return jax.random.fold_in(jax.random.fold_in(base, i), a)

    return jax.vmap(key)(instances, attempts)


def _sample_rows(
    logits_fn: LogitsFn,
    params: Any,
    prompts: jax.Array,
    keys: jax.Array,
    answer_length: int,
    temperature: jax.Array,
    top_p: jax.Array,
) -> jax.Array:
    # Each row is the shared sampler run on that one prompt with that row's own key.
    def one(prompt: jax.Array, key: jax.Array) -> jax.Array:
        row = sample_tokens(
            logits_fn, params, prompt[None, :], key, answer_length, temperature, top_p
        )
        return row[0]

    return jax.vmap(one)(prompts, keys)


_sample_rows_jit = jax.jit(_sample_rows, static_argnames=("logits_fn", "answer_length"))


def run_attempts(cfg: ModelConfig, params: Any, instances: Sequence[int]) -> list[Record]:
    """4 attempts at each of `instances` from the unscanned model fed per-layer views of
    `params`; one record per attempt, sorted by (instance, attempt)."""
    k = recipe.EVAL_ATTEMPTS_PER_INSTANCE
    rows = [(i, a) for i in sorted(instances) for a in range(k)]
    if not rows:
        return []
    outer, layers = unscan_params(params, axis=cfg.param_scan_axis)
    prompts = task.eval_prompts()[[i for i, _ in rows]]
    keys = attempt_keys(rows)
    chunks = []
    for start in range(0, len(rows), EVAL_BATCH_ROWS):
        batch = prompts[start : start + EVAL_BATCH_ROWS]
        batch_keys = keys[start : start + EVAL_BATCH_ROWS]
        real = batch.shape[0]
        if real < EVAL_BATCH_ROWS:  # pad with copies of the first row; their samples are dropped
            batch = np.concatenate([batch, np.repeat(batch[:1], EVAL_BATCH_ROWS - real, axis=0)])
            batch_keys = jnp.concatenate(
                [batch_keys, jnp.repeat(batch_keys[:1], EVAL_BATCH_ROWS - real, axis=0)]
            )
        sampled = _sample_rows_jit(
            unscanned_logits_fn(cfg),
            (outer, layers),
            jnp.asarray(batch, dtype=jnp.int32),
            batch_keys,
            answer_length=task.ANSWER_LENGTH,
            temperature=jnp.float32(recipe.EVAL_TEMPERATURE),
            top_p=jnp.float32(recipe.EVAL_TOP_P),
        )
        chunks.append(np.asarray(sampled)[:real])
    completions = np.concatenate(chunks)
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
