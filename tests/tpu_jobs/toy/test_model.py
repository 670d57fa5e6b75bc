"""The policy: scanned (training) and unscanned (eval) models compute the same function, layers
stacked on axis 1, per-layer views without copies, causal attention with rotary positions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_jobs.toy.model import (
    LAYERS_KEY,
    ModelConfig,
    apply_scanned,
    apply_unscanned,
    init_params,
    unscan_params,
)

CFG = ModelConfig(num_layers=3)
# Jitted once: op-by-op dispatch of the model costs seconds here.
scanned = jax.jit(lambda p, t: apply_scanned(CFG, p, t))


def _params(seed: int = 0) -> dict:
    params = init_params(CFG, jax.random.key(seed))
    # The head starts at zero (uniform policy); give it weights so logits depend on every layer.
    head = jax.random.normal(jax.random.key(seed + 100), params["lm_head"]["kernel"].shape)
    return {**params, "lm_head": {"kernel": head}}


def _tokens(batch: int = 4, length: int = 9) -> jax.Array:
    return jax.random.randint(jax.random.key(7), (batch, length), 0, CFG.vocab_size)


def test_layer_leaves_are_stacked_on_axis_1_and_nothing_else_is() -> None:
    params = init_params(CFG, jax.random.key(0))
    assert CFG.param_scan_axis == 1
    for leaf in jax.tree.leaves(params[LAYERS_KEY]):
        assert leaf.ndim >= 2 and leaf.shape[1] == CFG.num_layers
    assert params[LAYERS_KEY]["query"]["kernel"].shape == (64, 3, 8, 8)
    assert params[LAYERS_KEY]["attn_norm"]["scale"].shape == (64, 3)
    assert params["embed"]["embedding"].shape == (16, 64)
    assert params["lm_head"]["kernel"].shape == (64, 16)
    # Rotary positions: no parameter grows with max_sequence_length.
    assert sum(leaf.size for leaf in jax.tree.leaves(params)) < 300_000
    # The layers are initialised independently (split rngs), not copies of one layer.
    q = np.asarray(params[LAYERS_KEY]["query"]["kernel"])
    assert not np.array_equal(q[:, 0], q[:, 1])


def test_unscanned_model_gives_the_scanned_logits() -> None:
    params = _params()
    tokens = _tokens()
    outer, layers = unscan_params(jax.device_get(params))
    assert len(layers) == CFG.num_layers
    unscanned = jax.jit(lambda o, ls, t: apply_unscanned(CFG, o, ls, t))
    want = np.asarray(scanned(params, tokens))
    assert want.shape == (4, 9, 16)
    assert want.std() > 0.1  # a real function of the input, not all zeros
    np.testing.assert_allclose(
        np.asarray(unscanned(outer, layers, tokens)), want, rtol=1e-5, atol=1e-5
    )
    # The per-layer split matters: the same layers in another order are another function.
    swapped = np.asarray(unscanned(outer, layers[::-1], tokens))
    assert np.abs(swapped - want).max() > 1e-2


def test_unscan_params_returns_views_not_copies() -> None:
    stacked = jax.tree.map(np.array, jax.device_get(_params()))  # writable host copies
    outer, layers = unscan_params(stacked)
    kernel = stacked[LAYERS_KEY]["mlp_in"]["kernel"]
    for i, layer in enumerate(layers):
        view = layer["mlp_in"]["kernel"]
        assert np.shares_memory(view, kernel)
        np.testing.assert_array_equal(view, kernel[:, i])
    kernel[0, 2, 0] = 123.0
    assert layers[2]["mlp_in"]["kernel"][0, 0] == 123.0
    assert outer["embed"]["embedding"] is stacked["embed"]["embedding"]
    assert LAYERS_KEY not in outer


def test_attention_is_causal() -> None:
    params = _params()
    tokens = _tokens(batch=1, length=8)
    changed = tokens.at[0, 5].set((tokens[0, 5] + 1) % CFG.vocab_size)
    a, b = scanned(params, tokens), scanned(params, changed)
    np.testing.assert_array_equal(np.asarray(a[:, :5]), np.asarray(b[:, :5]))
    assert np.abs(np.asarray(a[:, 5:] - b[:, 5:])).max() > 1e-4


def test_positions_matter_without_a_position_table() -> None:
    params = _params()
    tokens = jnp.array([[10, 1, 2, 3, 4, 11]])
    swapped = jnp.array([[10, 2, 1, 3, 4, 11]])
    a, b = scanned(params, tokens)[:, -1], scanned(params, swapped)[:, -1]
    assert np.abs(np.asarray(a - b)).max() > 1e-4


def test_input_and_config_errors_name_the_problem() -> None:
    params = _params()
    small = ModelConfig(num_layers=3, max_sequence_length=8)
    with pytest.raises(ValueError, match="exceeds max_sequence_length 8"):
        apply_scanned(small, params, _tokens(length=9))
    outer, layers = unscan_params(jax.device_get(params))
    with pytest.raises(ValueError, match="got 2 layer trees"):
        apply_unscanned(CFG, outer, layers[:2], _tokens())
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        ModelConfig(d_model=66, num_heads=8)
    assert ModelConfig().max_sequence_length == 65536
