"""The sampler: temperature and nucleus filtering, autoregressive decoding, and the same samples
from the scanned (trainer) and unscanned (evaluator) models."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_jobs import task
from tpu_jobs.sampling import filter_logits, sample
from tpu_jobs.toy.model import (
    ModelConfig,
    init_params,
    scanned_logits_fn,
    unscan_params,
    unscanned_logits_fn,
)

PROBS = np.array([0.5, 0.3, 0.15, 0.05])


def fixed_logits(params: jax.Array, tokens: jax.Array) -> jax.Array:
    """A 'model' whose next-token distribution is `params`, whatever the input."""
    return jnp.broadcast_to(params, (*tokens.shape, params.shape[-1]))


def kept(top_p: float) -> list[int]:
    out = filter_logits(jnp.log(jnp.asarray(PROBS)), jnp.float32(1.0), jnp.float32(top_p))
    return np.flatnonzero(np.isfinite(np.asarray(out))).tolist()


def test_nucleus_keeps_the_smallest_top_set_reaching_top_p() -> None:
    assert kept(1.0) == [0, 1, 2, 3]
    assert kept(0.96) == [0, 1, 2, 3]  # the top three hold 0.95 < 0.96: the 4th is needed
    assert kept(0.94) == [0, 1, 2]
    assert kept(0.9) == [0, 1, 2]
    assert kept(0.75) == [0, 1]
    assert kept(0.3) == [0]  # the most likely token always stays


def frequencies(logits: np.ndarray, temperature: float, top_p: float, n: int = 20_000):
    prompts = np.zeros((n, 2), dtype=np.int32)
    out = sample(
        fixed_logits, jnp.asarray(logits, jnp.float32), prompts, jax.random.key(0),
        answer_length=1, temperature=temperature, top_p=top_p,
    )  # fmt: skip
    return np.bincount(np.asarray(out)[:, 0], minlength=len(logits)) / n


def test_samples_follow_the_filtered_distribution() -> None:
    logits = np.log(PROBS)
    np.testing.assert_allclose(frequencies(logits, 1.0, 1.0), PROBS, atol=0.015)
    np.testing.assert_allclose(frequencies(logits, 1.0, 0.75), [0.625, 0.375, 0, 0], atol=0.015)
    sharpened = PROBS**2 / (PROBS**2).sum()  # temperature 0.5 squares the probabilities
    np.testing.assert_allclose(frequencies(logits, 0.5, 1.0), sharpened, atol=0.015)
    # Validation temperature 0.1: a 0.5 vs 0.3 preference becomes near certainty.
    assert frequencies(logits, 0.1, 0.95)[0] > 0.99


def test_decoding_feeds_back_its_own_tokens() -> None:
    def successor(params: jax.Array, tokens: jax.Array) -> jax.Array:
        return 50.0 * jax.nn.one_hot((tokens + 1) % 10, 16)

    prompts = np.array([[0, 4], [0, 8]], dtype=np.int32)
    out = sample(successor, None, prompts, jax.random.key(1), answer_length=3, temperature=1.0,
                 top_p=1.0)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(out), [[5, 6, 7], [9, 0, 1]])


def test_scanned_and_unscanned_models_sample_the_same_answers() -> None:
    cfg = ModelConfig()
    params = init_params(cfg, jax.random.key(3))
    head = jax.random.normal(jax.random.key(4), params["lm_head"]["kernel"].shape)
    params = {**params, "lm_head": {"kernel": head}}
    prompts = task.eval_prompts()
    kwargs = dict(answer_length=2, temperature=1.0, top_p=0.95)
    a = sample(scanned_logits_fn(cfg), params, prompts, jax.random.key(5), **kwargs)
    b = sample(unscanned_logits_fn(cfg), unscan_params(jax.device_get(params)), prompts,
               jax.random.key(5), **kwargs)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert len(np.unique(np.asarray(a)[:, 0])) > 5  # genuinely random, not a constant


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.0, "top_p": 1.0}, "temperature must be > 0"),
        ({"temperature": 1.0, "top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"temperature": 1.0, "top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ],
)
def test_bad_sampling_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sample(fixed_logits, jnp.zeros(4), np.zeros((1, 2), np.int32), jax.random.key(0),
               answer_length=1, **kwargs)  # fmt: skip
