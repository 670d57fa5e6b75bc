"""The weights fingerprint: canonical over containers and array kinds, sensitive to every bit
of the bytes, the dtype and the leaf names."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_jobs.rcp.fingerprint import (
    FingerprintMismatchError,
    verify_fingerprint,
    weights_fingerprint,
)
from tpu_jobs.toy.model import ModelConfig, init_params

CFG = ModelConfig(d_model=32, num_heads=2, num_layers=3, d_ff=64)


def model_params(seed: int = 0) -> dict:
    return init_params(CFG, jax.random.PRNGKey(seed))


def test_fingerprint_is_canonical_and_sensitive() -> None:
    params = model_params()
    fp = weights_fingerprint(params)
    assert fp.startswith("sha256:") and len(fp) == len("sha256:") + 64
    # Same weights, other containers / key insertion order / host vs device arrays.
    reordered = {k: params[k] for k in reversed(list(params))}
    as_numpy = jax.tree.map(np.asarray, params)
    assert weights_fingerprint(reordered) == fp
    assert weights_fingerprint(as_numpy) == fp
    # One element changed, a dtype changed, a leaf renamed: all different.
    leaf = np.array(as_numpy["lm_head"]["kernel"])
    leaf[0, 0] = np.nextafter(leaf[0, 0], np.float32(np.inf))
    changed = {**as_numpy, "lm_head": {"kernel": leaf}}
    assert weights_fingerprint(changed) != fp
    cast = {**as_numpy, "lm_head": {"kernel": leaf.astype(np.float64)}}
    assert weights_fingerprint(cast) != weights_fingerprint(changed)
    renamed = {**as_numpy, "lm_head": {"kernel2": as_numpy["lm_head"]["kernel"]}}
    assert weights_fingerprint(renamed) != fp


def test_fingerprint_of_bfloat16_weights() -> None:
    weights = jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3)
    fp = weights_fingerprint({"w": weights})
    assert fp == weights_fingerprint({"w": np.asarray(weights)})
    assert fp != weights_fingerprint({"w": weights.astype(jnp.float16)})


def test_fingerprint_of_views_equals_fingerprint_of_copies() -> None:
    stacked = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    view = stacked[:, 1]  # non-contiguous
    assert not view.flags["C_CONTIGUOUS"]
    assert weights_fingerprint({"a": view}) == weights_fingerprint({"a": view.copy()})


def test_verify_fingerprint_names_where_and_both_fingerprints() -> None:
    params = model_params()
    fp = weights_fingerprint(params)
    verify_fingerprint(params, fp, where="here")
    other = weights_fingerprint(model_params(1))
    with pytest.raises(FingerprintMismatchError, match=f"^there: .*{other}, expected {fp}"):
        verify_fingerprint(model_params(1), fp, where="there")
