"""The weights fingerprint: which bytes identify a set of weights, and the check on restore.

A sha256 over every leaf's name, dtype, shape and bytes in a canonical leaf order, so it does
not depend on container types or on where the arrays live. Taken at save time and stored with
the checkpoint; a restore whose weights hash differently is refused before anything scores them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import numpy as np

FINGERPRINT_ALGORITHM = "sha256"

PyTree = Any


class FingerprintMismatchError(ValueError):
    """The restored weights are not the weights that were recorded."""


def leaf_name(path: jax.tree_util.KeyPath) -> str:
    """A leaf's path in the tree as ``a/b/c``: its name in fingerprints and error messages."""
    return jax.tree_util.keystr(path, simple=True, separator="/")


def weights_fingerprint(params: PyTree) -> str:
    """``sha256:<hex>`` over every leaf's name, dtype, shape and bytes, leaves sorted by name.

    Independent of the container types (dict, FrozenDict) and of where the arrays live (JAX
    device arrays are read to host; numpy views are hashed as their logical contents).
    """
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    named = sorted(((leaf_name(p), leaf) for p, leaf in leaves), key=lambda item: item[0])
    names = [name for name, _ in named]
    if len(set(names)) != len(names):
        raise ValueError("weights_fingerprint: two parameter leaves have the same name")
    digest = hashlib.sha256()
    for name, leaf in named:
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update(f"{name}|{array.dtype.str}|{array.shape}\n".encode())
        digest.update(array.reshape(-1).view(np.uint8).data)
    return f"{FINGERPRINT_ALGORITHM}:{digest.hexdigest()}"


def verify_fingerprint(params: PyTree, expected: str, where: str) -> None:
    """Raise `FingerprintMismatchError` naming `where` unless `params` hash to `expected`."""
    got = weights_fingerprint(params)
    if got != expected:
        raise FingerprintMismatchError(
            f"{where}: restored weights have fingerprint {got}, expected {expected}: the "
            "checkpoint is not the one recorded (or was corrupted); refusing to use it"
        )
