"""MaxText's parameter trees in their two layouts, and the one rounding between them.

Scanned (training): each decoder layer's leaves stacked into one ``decoder/layers/...`` leaf
with the layer index on `PARAM_SCAN_AXIS` (MaxText's ``param_scan_axis``, 1: a kernel
``(emb, mlp)`` is stored ``(emb, layers, mlp)``, a norm scale ``(emb,)`` as ``(emb, layers)``).
Unscanned (MaxText's converter output, what ``from_pretrained(scan_layers=false)`` builds): one
``decoder/layers_<i>/...`` subtree per layer, in bfloat16.

rcpflow's weights fingerprint (`tpu_jobs.rcp.fingerprint`) is the same for the same leaves
whatever their sharding, but names and shapes are part of it; so the evaluator compares in the
scanned layout: `restack` puts the unscanned layers back on the scan axis (a copy of the layer
weights, one leaf at a time on the device), and the training side fingerprints its scanned
weights rounded with `as_bf16`, which is bit for bit the converter's ``astype(bfloat16)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

PARAM_SCAN_AXIS = 1
DECODER = "decoder"
# MaxText's scanned layer groups (``layers``; DeepSeek's ``dense_layers`` and ``moe_layers``).
_UNSCANNED = re.compile(r"(layers|dense_layers|moe_layers)_(\d+)")

Tree = Mapping[str, Any]


def as_bf16(tree: Any) -> Any:
    """Every floating leaf rounded to bfloat16 (round to nearest even), others as they are."""

    def cast(leaf: Any) -> Any:
        return leaf.astype(jnp.bfloat16) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf

    return jax.tree.map(cast, tree)


def restack(unscanned: Tree, axis: int = PARAM_SCAN_AXIS) -> dict[str, Any]:
    """The scanned tree of an unscanned one: ``decoder/layers_0..layers_{n-1}`` become
    ``decoder/layers``, each leaf stacked on `axis`; other leaves as they are."""
    if DECODER not in unscanned:
        raise KeyError(f"restack: no {DECODER!r} subtree in {sorted(unscanned)}")
    decoder = dict(unscanned[DECODER])
    groups: dict[str, dict[int, Any]] = {}
    for name in list(decoder):
        match = _UNSCANNED.fullmatch(name)
        if match:
            groups.setdefault(match[1], {})[int(match[2])] = decoder.pop(name)
    if not groups:
        raise KeyError(f"restack: no unscanned layers under {DECODER!r}: {sorted(decoder)}")
    for group, layers in groups.items():
        if sorted(layers) != list(range(len(layers))):
            raise KeyError(f"restack: {group}_<i> are not 0..n-1: {sorted(layers)}")
        if group in decoder:
            raise KeyError(f"restack: {DECODER}/{group} is there already, scanned")
        ordered = [layers[i] for i in range(len(layers))]
        decoder[group] = jax.tree.map(lambda *xs: jnp.stack(xs, axis=axis), *ordered)
    return {**unscanned, DECODER: decoder}


def unstack(scanned: Tree, axis: int = PARAM_SCAN_AXIS) -> dict[str, Any]:
    """The unscanned tree of a scanned one (the reverse of `restack`): each stacked leaf sliced
    on `axis` into ``decoder/<group>_<i>``."""
    decoder = dict(scanned[DECODER])
    for group in [g for g in decoder if g in ("layers", "dense_layers", "moe_layers")]:
        stacked = decoder.pop(group)
        sizes = {leaf.shape[axis] for leaf in jax.tree.leaves(stacked)}
        if len(sizes) != 1:
            raise ValueError(f"unstack: {group} leaves disagree on the layer axis: {sizes}")
        for i in range(sizes.pop()):
            decoder[f"{group}_{i}"] = jax.tree.map(
                lambda leaf, i=i: jnp.take(leaf, i, axis=axis), stacked
            )
    return {**scanned, DECODER: decoder}
