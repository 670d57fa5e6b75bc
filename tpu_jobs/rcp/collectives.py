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
from jax.sharding import Mesh, NamedSharding, PartitionSpec


@cache
def _process_mesh() -> Mesh:
    # One device of each process, in process order: the host-level agreements need no more.
    firsts: dict[int, jax.Device] = {}
    for device in sorted(jax.devices(), key=lambda d: d.id):
        firsts.setdefault(device.process_index, device)
    return Mesh(np.asarray([firsts[p] for p in sorted(firsts)]), ("processes",))


@cache
def _rows_fn(mesh: Mesh) -> Any:
    # Compiled once per shape (multihost_utils builds its program anew on every call: about
    # 0.1 s a step, measured on two CPU processes).
    return jax.jit(lambda rows: rows, out_shardings=NamedSharding(mesh, PartitionSpec()))


def _every_process_row(values: Sequence[int]) -> np.ndarray:
    """(process_count, len(values)): each process's `values`, on every process."""
    mesh = _process_mesh()
    local = np.asarray(values, np.int32).reshape(1, -1)  # steps and flags: JAX runs 32-bit
    rows = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec("processes")), local, (mesh.size, local.shape[1])
    )
    return np.asarray(_rows_fn(mesh)(rows))


def from_primary(values: Sequence[int]) -> list[int]:
    """Process 0's `values` on every process (the others pass placeholders of the same length)."""
    if jax.process_count() == 1:
        return list(values)
    return [int(v) for v in _every_process_row(values)[0]]


def any_process(flags: Sequence[bool]) -> list[bool]:
    """Per position: whether any process passed True there (every process gets the answer)."""
    if jax.process_count() == 1:
        return [bool(f) for f in flags]
    anywhere = np.asarray(_every_process_row([int(bool(f)) for f in flags]).any(axis=0))
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
