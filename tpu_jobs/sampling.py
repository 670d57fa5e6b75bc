"""Sampling answers with temperature and nucleus (top-p) filtering, for any model.

The model is a ``LogitsFn = (params, tokens) -> logits`` (the toy's are in `tpu_jobs.toy.model`),
so training rollouts and evaluation attempts share one sampler; ``temperature`` and ``top_p``
are traced values, so both use one compiled program. Decoding recomputes the whole (short)
sequence each token instead of keeping a KV cache: answers here are a few tokens long.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

LogitsFn = Callable[[Any, jax.Array], jax.Array]


def filter_logits(logits: jax.Array, temperature: jax.Array, top_p: jax.Array) -> jax.Array:
    """Scale by temperature, then keep the smallest top set of tokens with mass >= ``top_p``.

    Tokens outside the nucleus get ``-inf``; the most likely token is always kept.
    """
    scaled = logits / temperature
    ordered = jnp.sort(scaled, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(ordered, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    in_nucleus = mass_before < top_p
    threshold = jnp.min(jnp.where(in_nucleus, ordered, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(scaled >= threshold, scaled, -jnp.inf)


def sample_tokens(
    logits_fn: LogitsFn,
    params: Any,
    prompts: jax.Array,
    rng: jax.Array,
    answer_length: int,
    temperature: jax.Array,
    top_p: jax.Array,
) -> jax.Array:
    """Traceable core of ``sample`` (for use inside a caller's jit): ``(batch, answer_length)``."""
    tokens = prompts
    for i in range(answer_length):
        logits = logits_fn(params, tokens)[:, -1, :]
        logits = filter_logits(logits, temperature, top_p)
        nxt = jax.random.categorical(jax.random.fold_in(rng, i), logits, axis=-1)
        tokens = jnp.concatenate([tokens, nxt[:, None].astype(tokens.dtype)], axis=1)
    return tokens[:, prompts.shape[1] :]


_sample_jit = jax.jit(sample_tokens, static_argnames=("logits_fn", "answer_length"))


def sample(
    logits_fn: LogitsFn,
    params: Any,
    prompts: Any,
    rng: jax.Array,
    *,
    answer_length: int,
    temperature: float,
    top_p: float,
) -> jax.Array:
    """Sample ``answer_length`` tokens after each prompt row: int32 ``(batch, answer_length)``."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if answer_length < 1:
        raise ValueError(f"answer_length must be >= 1, got {answer_length}")
    return _sample_jit(
        logits_fn,
        params,
        jnp.asarray(prompts, dtype=jnp.int32),
        rng,
        answer_length=answer_length,
        temperature=jnp.float32(temperature),
        top_p=jnp.float32(top_p),
    )
