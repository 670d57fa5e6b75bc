"""The toy policy's evaluation attempts (`run_attempts`), sampled from the unscanned model fed
per-layer views of the scanned params, `EVAL_BATCH_ROWS` rows per sampler call
(`tpu_jobs.eval.attempts` has the keys and the rest of the contract).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rcpflow import recipe
from tpu_jobs import task
from tpu_jobs.eval.attempts import attempt_keys, attempt_rows, pad_rows, scored
from tpu_jobs.eval.shards import Record
from tpu_jobs.sampling import LogitsFn, sample_tokens
from tpu_jobs.toy.model import ModelConfig, unscan_params, unscanned_logits_fn

# Rows (instance, attempt) per sampler call; a multiple of the attempts per instance.
EVAL_BATCH_ROWS = 256


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
    """4 attempts at each of `instances`; one record per attempt, sorted by (instance, attempt)."""
    rows = attempt_rows(instances)
    if not rows:
        return []
    outer, layers = unscan_params(params, axis=cfg.param_scan_axis)
    prompts = task.eval_prompts()[[i for i, _ in rows]]
    keys = attempt_keys(rows)
    chunks = []
    for start in range(0, len(rows), EVAL_BATCH_ROWS):
        real = min(EVAL_BATCH_ROWS, len(rows) - start)
        batch, batch_keys = pad_rows(
            prompts[start : start + EVAL_BATCH_ROWS],
            keys[start : start + EVAL_BATCH_ROWS],
            EVAL_BATCH_ROWS,
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
    return scored(rows, prompts, np.concatenate(chunks))
