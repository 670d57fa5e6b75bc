"""The weights fingerprint: which bits identify a set of weights, and the check on restore.

The current scheme, ``pos32:<hex>``, is computed on the accelerator where the weights live: for
each leaf and each of two lanes, the sum mod 2^32 of every element's bits (as uint32) times an
odd weight derived from its global position (a product of per-axis hashes of its index). Integer
addition mod 2^32 does not depend on the order of the sum, so the value is the same for the same
weights in any layout (one process or N, any sharding): jit runs it under the arrays' sharding,
each device sums its shard and XLA inserts the reduction. A changed element changes its term (an
odd multiplier is a bijection mod 2^32), hence the sum. Not cryptographic. The per-leaf sums (8
bytes each) come to the host, where sha256 binds them to the leaves' names, dtypes and shapes.
On several processes every process must call it (a collective); the result is replicated.

``sha256:<hex>`` (host bytes of every leaf) is the earlier scheme: still verified, never written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

POSITIONAL = "pos32"
SHA256 = "sha256"
# Independent seeds of the two lanes and of each axis' index hash.
_LANE_SEEDS = (0x9E3779B9, 0x85EBCA77)
_AXIS_SALT = 0x27D4EB2F

PyTree = Any


class FingerprintMismatchError(ValueError):
    """The restored weights are not the weights that were recorded."""


def leaf_name(path: jax.tree_util.KeyPath) -> str:
    """A leaf's path in the tree as ``a/b/c``: its name in fingerprints and error messages."""
    return jax.tree_util.keystr(path, simple=True, separator="/")


def _named_leaves(params: PyTree) -> list[tuple[str, Any]]:
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    named = sorted(((leaf_name(p), leaf) for p, leaf in leaves), key=lambda item: item[0])
    names = [name for name, _ in named]
    if len(set(names)) != len(names):
        raise ValueError("weights_fingerprint: two parameter leaves have the same name")
    return named


def _mix(x: jax.Array) -> jax.Array:
    # murmur3's 32-bit finaliser: every input bit affects every output bit.
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def _bits(leaf: jax.Array) -> jax.Array:
    """The leaf's elements as uint32 words carrying exactly their bits."""
    dtype = jnp.dtype(leaf.dtype)
    if dtype == jnp.bool_:
        return leaf.astype(jnp.uint32)
    if dtype.itemsize == 4:
        return jax.lax.bitcast_convert_type(leaf, jnp.uint32)
    if dtype.itemsize == 2:
        return jax.lax.bitcast_convert_type(leaf, jnp.uint16).astype(jnp.uint32)
    if dtype.itemsize == 1:
        return jax.lax.bitcast_convert_type(leaf, jnp.uint8).astype(jnp.uint32)
    raise TypeError(f"weights_fingerprint: no {POSITIONAL} words for dtype {dtype}")


def _leaf_sums(leaf: jax.Array) -> jax.Array:
    """(2,) uint32: per lane, sum of bits * odd positional weight, mod 2^32."""
    words = _bits(leaf)
    lanes = []
    for seed in _LANE_SEEDS:
        weight = jnp.ones(words.shape, jnp.uint32)
        for axis, size in enumerate(words.shape):
            index = jnp.arange(size, dtype=jnp.uint32)
            axis_hash = _mix(index ^ jnp.uint32((seed + _AXIS_SALT * (axis + 1)) & 0xFFFFFFFF))
            shape = [1] * words.ndim
            shape[axis] = size
            weight = weight * (axis_hash | jnp.uint32(1)).reshape(shape)
        lanes.append(jnp.sum(words * weight, dtype=jnp.uint32))
    return jnp.stack(lanes)


@cache
def _sums_fn(replicated: jax.sharding.Sharding | None) -> Any:
    def sums(leaves: Sequence[jax.Array]) -> jax.Array:
        if not leaves:
            return jnp.zeros((0, 2), jnp.uint32)
        return jnp.stack([_leaf_sums(leaf) for leaf in leaves])

    return jax.jit(sums, out_shardings=replicated)


def _replicated_out(leaves: Sequence[Any]) -> jax.sharding.Sharding | None:
    """A replicated output sharding over the mesh of the first sharded leaf (so that every
    process gets the value), or None for host or single-device leaves."""
    for leaf in leaves:
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding):
            return NamedSharding(sharding.mesh, PartitionSpec())
    return None


def _start_sums(params: PyTree) -> tuple[list[tuple[str, Any]], jax.Array]:
    named = _named_leaves(params)
    leaves = [jnp.asarray(leaf) if isinstance(leaf, np.ndarray) else leaf for _, leaf in named]
    return named, _sums_fn(_replicated_out(leaves))(leaves)


class PendingFingerprint:
    """A fingerprint whose device computation is dispatched but not awaited: `result` blocks
    (in whichever thread calls it) and returns ``pos32:<hex>``. Dispatch order is what the
    processes of a job must agree on, so start it where every process starts it."""

    def __init__(self, named: list[tuple[str, Any]], sums: jax.Array) -> None:
        self._named = [(name, np.dtype(leaf.dtype).str, tuple(leaf.shape)) for name, leaf in named]
        self._sums: jax.Array | None = sums
        self._value = ""

    def result(self) -> str:
        if self._sums is not None:
            digest = hashlib.sha256()
            sums = np.asarray(self._sums)
            for (name, dtype, shape), lanes in zip(self._named, sums, strict=True):
                digest.update(f"{name}|{dtype}|{shape}|{lanes[0]:08x}{lanes[1]:08x}\n".encode())
            self._value = f"{POSITIONAL}:{digest.hexdigest()}"
            self._sums = None  # its device buffer is not needed any more
        return self._value


def start_fingerprint(params: PyTree) -> PendingFingerprint:
    """Dispatch the ``pos32`` fingerprint of `params` on the device and return at once; on
    several processes a collective every process must start, in the same order."""
    return PendingFingerprint(*_start_sums(params))


def weights_fingerprint(params: PyTree) -> str:
    """``pos32:<hex>`` of `params` (JAX arrays of any sharding, or numpy arrays); on several
    processes a collective that blocks until every process's shards are computed."""
    return start_fingerprint(params).result()


def sha256_fingerprint(params: PyTree) -> str:
    """The earlier ``sha256:<hex>`` over every leaf's name, dtype, shape and host bytes, leaves
    sorted by name: read only to verify checkpoints written before `POSITIONAL`."""
    digest = hashlib.sha256()
    for name, leaf in _named_leaves(params):
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update(f"{name}|{array.dtype.str}|{array.shape}\n".encode())
        digest.update(array.reshape(-1).view(np.uint8).data)
    return f"{SHA256}:{digest.hexdigest()}"


def fingerprint_as(params: PyTree, like: str) -> str:
    """The fingerprint of `params` in the scheme of the recorded fingerprint `like`."""
    scheme = like.partition(":")[0]
    if scheme == POSITIONAL:
        return weights_fingerprint(params)
    if scheme == SHA256:
        return sha256_fingerprint(params)
    raise FingerprintMismatchError(f"unknown weights fingerprint scheme {scheme!r} in {like!r}")


def verify_fingerprint(params: PyTree, expected: str, where: str) -> None:
    """Raise `FingerprintMismatchError` naming `where` unless `params` fingerprint to
    `expected` (in its own scheme)."""
    got = fingerprint_as(params, expected)
    if got != expected:
        raise FingerprintMismatchError(
            f"{where}: restored weights have fingerprint {got}, expected {expected}: the "
            "checkpoint is not the one recorded (or was corrupted); refusing to use it"
        )
