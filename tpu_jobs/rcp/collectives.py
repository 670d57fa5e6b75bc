"""The few agreements the processes of one job make: process 0's decision reaches every
process; a flag any process raised reaches every process; every process's shards of a tree are
computed (`wait_everywhere`). One process: no collective."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec


def from_primary(values: Sequence[int]) -> list[int]:
    """Process 0's `values` on every process (the others pass placeholders of the same length)."""
    if jax.process_count() == 1:
        return list(values)
    got = multihost_utils.broadcast_one_to_all(np.asarray(values, np.int64))
    return [int(v) for v in got]


def any_process(flags: Sequence[bool]) -> list[bool]:
    """Per position: whether any process passed True there (every process gets the answer)."""
    if jax.process_count() == 1:
        return [bool(f) for f in flags]
    got = np.asarray(multihost_utils.process_allgather(np.asarray(flags, np.int32)))
    anywhere = np.asarray(got.reshape(jax.process_count(), -1).any(axis=0))
    return [bool(anywhere[i]) for i in range(len(flags))]


def _first_mesh_sharding(leaves: Sequence[Any]) -> NamedSharding | None:
    for leaf in leaves:
        if isinstance(leaf, jax.Array) and isinstance(leaf.sharding, NamedSharding):
            return NamedSharding(leaf.sharding.mesh, PartitionSpec())
    return None


@cache
def _corners_fn(replicated: NamedSharding) -> Any:
    # One element of each leaf, made replicated: the program takes every device's shard as an
    # input, so it runs (and its result reaches process 0) only once every shard is computed.
    def corners(leaves: Sequence[jax.Array]) -> jax.Array:
        return jnp.stack([leaf[(0,) * leaf.ndim].astype(jnp.float32) for leaf in leaves])

    return jax.jit(corners, out_shardings=replicated)


def wait_everywhere(tree: Any) -> None:
    """Block until `tree`'s arrays are computed on every process (one process: on this one).

    Blocking on arrays waits for this process's shards only; this waits for a tiny collective
    over every shard instead, at a cost that grows with the number of leaves, not their size."""
    leaves = [leaf for leaf in jax.tree.leaves(tree) if isinstance(leaf, jax.Array) and leaf.size]
    replicated = _first_mesh_sharding(leaves)
    if jax.process_count() == 1 or replicated is None or not leaves:
        jax.block_until_ready(leaves)
        return
    jax.block_until_ready(_corners_fn(replicated)(leaves))
