"""How a trainer lays its arrays over every device of every process: one ``("fsdp",)`` mesh,
per-leaf `NamedSharding` (each leaf split along its largest axis that the device count divides,
else replicated), and the global batch built from each process's own rows.

One process with one device is the same code with a mesh of one.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "fsdp"
PyTree = Any


class BatchSplitError(ValueError):
    """The global batch cannot be split evenly over the devices (a bad argument)."""


def mesh() -> Mesh:
    """All devices of the system, in process order, on one axis."""
    return Mesh(np.array(jax.devices()), (AXIS,))


def replicated(m: Mesh) -> NamedSharding:
    return NamedSharding(m, PartitionSpec())


def leaf_sharding(m: Mesh, shape: tuple[int, ...]) -> NamedSharding:
    """Split along the largest axis the mesh size divides (the first such, on a tie)."""
    size = m.devices.size
    candidates = [(dim, -axis) for axis, dim in enumerate(shape) if dim % size == 0 and dim > 1]
    if size == 1 or not candidates:
        return replicated(m)
    _, neg_axis = max(candidates)
    spec: list[str | None] = [None] * len(shape)
    spec[-neg_axis] = AXIS
    return NamedSharding(m, PartitionSpec(*spec))


def tree_shardings(m: Mesh, tree: PyTree) -> PyTree:
    """`leaf_sharding` of every array leaf of `tree` (arrays or `jax.ShapeDtypeStruct`s)."""
    return jax.tree.map(lambda leaf: leaf_sharding(m, tuple(leaf.shape)), tree)


def batch_sharding(m: Mesh) -> NamedSharding:
    """Rows over the devices."""
    return NamedSharding(m, PartitionSpec(AXIS))


def check_batch(m: Mesh, rows: int, what: str) -> None:
    """Raise `BatchSplitError` naming `what` unless `rows` split evenly over the devices."""
    if rows % m.devices.size:
        raise BatchSplitError(
            f"{what}: {rows} rows per step cannot be split evenly over {m.devices.size} "
            f"devices ({jax.process_count()} processes)"
        )


def local_rows(m: Mesh, rows: int) -> tuple[int, int]:
    """The [start, stop) rows of a global batch of `rows` that this process's devices hold."""
    slices = [
        index[0]
        for index in batch_sharding(m).addressable_devices_indices_map((rows,)).values()
        if index is not None
    ]
    starts = [s.start or 0 for s in slices]
    stops = [rows if s.stop is None else s.stop for s in slices]
    return min(starts), max(stops)


def global_batch(m: Mesh, local: np.ndarray, rows: int) -> jax.Array:
    """The global ``(rows, ...)`` batch from this process's `local` rows (`local_rows`)."""
    return jax.make_array_from_process_local_data(
        batch_sharding(m), local, (rows, *local.shape[1:])
    )
