"""The toy policy's evaluation attempts (`run_attempts`), sampled from the unscanned model,
`EVAL_BATCH_ROWS` rows per sampler call (`tpu_jobs.eval.attempts` has the keys and the rest of
the contract), on every device of the mesh the params lie on.

The params stay sharded at rest (each process holds its own shards); the sampler gathers each
layer's weights where the model applies it, and every device samples the whole (replicated)
batch, so one device or N compute each row with the same arithmetic (docs/tpu_jobs.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from rcpflow import recipe
from tpu_jobs import task
from tpu_jobs.eval.attempts import attempt_keys, attempt_rows, pad_rows, scored
from tpu_jobs.eval.shards import Record
from tpu_jobs.rcp import sharding
from tpu_jobs.sampling import sample_tokens
from tpu_jobs.toy.model import LAYERS_KEY, ModelConfig, unscanned_logits_fn

# Rows (instance, attempt) per sampler call; a multiple of the attempts per instance.
EVAL_BATCH_ROWS = 256


@cache
def _sampler(cfg: ModelConfig, replicated: NamedSharding) -> Any:
    """The jitted ``(params, prompts, keys, temperature, top_p) -> tokens`` over `replicated`'s
    mesh: scanned params in, the replicated answer tokens out."""
    model = unscanned_logits_fn(cfg)

    def gathered(tree: Any) -> Any:
        return jax.lax.with_sharding_constraint(tree, replicated)

    def logits_fn(params: Any, tokens: jax.Array) -> jax.Array:
        # Each layer's weights gathered where it is applied (not the whole model at once).
        outer, layers = params
        return model((gathered(outer), [gathered(layer) for layer in layers]), tokens)

    def sample(
        params: Any, prompts: jax.Array, keys: jax.Array, temperature: jax.Array, top_p: jax.Array
    ) -> jax.Array:
        stacked = params[LAYERS_KEY]
        layers = [
            jax.tree.map(lambda a, i=i: jnp.take(a, i, axis=cfg.param_scan_axis), stacked)
            for i in range(cfg.num_layers)
        ]
        outer = {key: value for key, value in params.items() if key != LAYERS_KEY}

        # Each row is the shared sampler run on that one prompt with that row's own key.
        def one(prompt: jax.Array, key: jax.Array) -> jax.Array:
            row = sample_tokens(
                logits_fn, (outer, layers), prompt[None, :], key, task.ANSWER_LENGTH,
                temperature, top_p,
            )  # fmt: skip
            return row[0]

        return jax.vmap(one)(prompts, keys)

    return jax.jit(sample, out_shardings=replicated)


def run_attempts(cfg: ModelConfig, params: Any, instances: Sequence[int], m: Mesh) -> list[Record]:
    """4 attempts at each of `instances`; one record per attempt, sorted by (instance, attempt).
    `params` (scanned) lie on `m`; on several processes every process calls it (a collective)."""
    rows = attempt_rows(instances)
    if not rows:
        return []
    replicated = sharding.replicated(m)
    sampler = _sampler(cfg, replicated)

    def on_mesh(host: np.ndarray) -> jax.Array:
        # The same host values on every process: each one's devices get a copy.
        return jax.make_array_from_process_local_data(replicated, host, host.shape)

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
        sampled = sampler(
            params,
            on_mesh(np.asarray(batch, dtype=np.int32)),
            on_mesh(np.asarray(batch_keys)),
            on_mesh(np.asarray(recipe.EVAL_TEMPERATURE, np.float32)),
            on_mesh(np.asarray(recipe.EVAL_TOP_P, np.float32)),
        )
        chunks.append(np.asarray(sampled.addressable_data(0))[:real])
    return scored(rows, prompts, np.concatenate(chunks))
