"""The policy: a small `tunix.models.qwen3` Qwen3 with Tunix's own initialisation, and the mesh.

Initialised by the model's own initialisers (`nnx.Rngs(params=seed)`), not by
`tunix.models.dummy_model_creator` (which draws every weight, norms included, as 0.02 N(0,1); that
policy did not learn in 40 steps). The ``lm_head`` starts at zero, so the first policy is
uniform over the vocabulary: a 1-in-16 chance of the answer gives most groups of 16 a signal.

The mesh is ``("fsdp", "tp")`` built from the devices directly: Qwen3's sharding rules name those
axes, and `jax.make_mesh` gives explicit-sharding axes that Tunix 0.1.7 fails on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.models.qwen3 import model as qwen3

from tpu_jobs import task


@dataclass(frozen=True)
class ModelConfig:
    """The policy's size, as the toy's and MaxText's `ModelConfig` are theirs (recorded in every
    checkpoint, so the evaluator rebuilds the model): the sizes that vary; everything else of
    Tunix's `qwen3.ModelConfig` is fixed in `qwen3`."""

    num_layers: int = 2
    embed_dim: int = 64
    hidden_dim: int = 256
    num_heads: int = 8
    head_dim: int = 8

    def qwen3(self) -> qwen3.ModelConfig:
        return qwen3.ModelConfig(
            num_layers=self.num_layers,
            vocab_size=task.VOCAB_SIZE,
            embed_dim=self.embed_dim,
            hidden_dim=self.hidden_dim,
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            num_kv_heads=self.num_heads,
            rope_theta=10_000,
            norm_eps=1e-6,
            use_tied_embedding=False,
        )

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any, where: str) -> ModelConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(d, dict) or set(d) != names:
            raise ValueError(f"{where}: policy config must have exactly {sorted(names)}, got {d!r}")
        return cls(**{k: int(v) for k, v in d.items()})


def mesh() -> jax.sharding.Mesh:
    """All devices on ``fsdp``, none on ``tp`` (on CPU: XLA's forced host device count)."""
    devices = np.asarray(jax.devices())
    return jax.sharding.Mesh(devices.reshape(devices.size, 1), ("fsdp", "tp"))


def build(config: ModelConfig, seed: int) -> qwen3.Qwen3:
    model = qwen3.Qwen3(config.qwen3(), rngs=nnx.Rngs(params=seed))
    model.lm_head.w[...] = jnp.zeros_like(model.lm_head.w[...])
    return model


def abstract(config: ModelConfig) -> qwen3.Qwen3:
    """The model's structure without weights (to restore a checkpoint into)."""
    return nnx.eval_shape(lambda: qwen3.Qwen3(config.qwen3(), rngs=nnx.Rngs(params=0)))


def params(model: nnx.Module) -> dict[str, Any]:
    """The trained parameters as a plain nested dict (the fingerprinted tree)."""
    return nnx.state(model, nnx.Param).to_pure_dict()


def last_logits(model: qwen3.Qwen3, tokens: jax.Array) -> jax.Array:
    """Next-token logits after each full row of `tokens` ``(B, L)`` (no padding, no cache)."""
    b, length = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
    causal = jnp.broadcast_to(
        jnp.tril(jnp.ones((length, length), dtype=jnp.bool_)), (b, length, length)
    )
    logits, _ = model(tokens, positions, None, causal)
    return logits[:, -1, :]
