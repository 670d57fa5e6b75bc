"""The weights fingerprint: canonical over containers, array kinds and layouts (1 device or N,
any sharding), sensitive to every bit, to positions, the dtype and the leaf names; the earlier
sha256 scheme still verifies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_jobs.rcp.fingerprint import (
    FingerprintMismatchError,
    sha256_fingerprint,
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
    assert fp.startswith("pos32:") and len(fp) == len("pos32:") + 64
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


def test_every_flipped_bit_and_every_swap_changes_it() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3, 16)).astype(np.float32)
    fp = weights_fingerprint({"w": w})
    for _ in range(20):
        flipped = w.copy()
        flipped.reshape(-1).view(np.uint32)[rng.integers(w.size)] ^= np.uint32(
            1 << int(rng.integers(32))
        )
        assert weights_fingerprint({"w": flipped}) != fp
    swapped = w.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # same multiset of values, other positions
    assert weights_fingerprint({"w": swapped}) != fp
    transposed = np.ascontiguousarray(w.reshape(3, 8, 16))  # same bytes, other shape
    assert weights_fingerprint({"w": transposed}) != fp
    half = {"w": jnp.asarray(w, jnp.bfloat16)}
    assert weights_fingerprint(half) == weights_fingerprint({"w": np.asarray(half["w"])})


def test_the_earlier_sha256_fingerprints_still_verify() -> None:
    params = model_params()
    old = sha256_fingerprint(params)
    assert old.startswith("sha256:")
    verify_fingerprint(params, old, where="old")
    with pytest.raises(FingerprintMismatchError, match=r"^old: "):
        verify_fingerprint(model_params(1), old, where="old")
    with pytest.raises(FingerprintMismatchError, match="unknown weights fingerprint scheme"):
        verify_fingerprint(params, "md5:00", where="x")


LAYOUTS = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tpu_jobs.rcp.fingerprint import weights_fingerprint
w = np.random.default_rng(0).standard_normal((8, 4, 6)).astype(np.float32)
b = np.arange(12, dtype=np.int32)
devices = np.array(jax.devices())
assert devices.size == 4, devices
prints = {weights_fingerprint({"w": w, "b": b})}
for shape, names, spec_w, spec_b in [
    ((4,), ("x",), P("x"), P("x")),
    ((4,), ("x",), P(None, "x"), P()),
    ((2, 2), ("x", "y"), P("x", "y"), P(("x", "y"))),
    ((2, 2), ("x", "y"), P(None, None, "y"), P("y")),
]:
    mesh = Mesh(devices.reshape(shape), names)
    tree = {"w": jax.device_put(w, NamedSharding(mesh, spec_w)),
            "b": jax.device_put(b, NamedSharding(mesh, spec_b))}
    prints.add(weights_fingerprint(tree))
print(len(prints))
"""


def test_the_same_weights_give_the_same_value_in_any_sharding() -> None:
    repo = Path(__file__).resolve().parents[3]
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "PYTHONPATH": str(repo),
    }
    proc = subprocess.run(
        [sys.executable, "-c", LAYOUTS], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "1"
