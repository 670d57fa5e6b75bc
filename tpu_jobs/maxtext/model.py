"""MaxText driven from Python: its trainer's setup and train step (`Trainer`), its scanned ->
unscanned converter (`convert`), its restore (`restore`) and its model's next-token logits
(`answer_sampler`). Needs MaxText 0.2.5 (its environment: docs/maxtext.md).

`Trainer` is MaxText's ``train_loop`` without its loop: ``maxtext.trainers.pre_train.train``'s
``initialize`` (config, the ``unsafe_rbg`` PRNG it sets) and ``train_utils.setup_train_loop``
(mesh, the NNX model and optimizer, MaxText's Orbax checkpointer, which restores the newest
checkpoint of the run folder), its ``train_step`` jitted by ``jit_train_and_eval_step`` and
compiled once, and its ``checkpointing.save_checkpoint``; only the batches (the digit task) and
the recording (`tpu_jobs.maxtext.train`) are this job's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.core.spmd import logical_axis_rules
from maxtext.common import checkpointing  # type: ignore[import-not-found]
from maxtext.configs import pyconfig  # type: ignore[import-not-found]
from maxtext.trainers.pre_train import train as maxtext_train  # type: ignore[import-not-found]
from maxtext.utils import (  # type: ignore[import-not-found]
    generate_param_only_checkpoint,
    maxtext_utils,
    model_creation_utils,
    sharding,
    train_utils,
)

from tpu_jobs import task
from tpu_jobs.maxtext import config
from tpu_jobs.maxtext.checkpoints import CheckpointRecord, WithRecord, items_path
from tpu_jobs.sampling import filter_logits

# MaxText's trainer saves its RNG keys with this implementation (its `initialize` sets it);
# its converter reads them back only under the same one (JAX_DEFAULT_PRNG_IMPL).
MAXTEXT_PRNG_IMPL = "unsafe_rbg"
Batch = dict[str, np.ndarray]


def use_maxtext_prng() -> None:
    """The PRNG implementation MaxText's trainer uses, for this process (and its children)."""
    os.environ["JAX_DEFAULT_PRNG_IMPL"] = MAXTEXT_PRNG_IMPL
    cast(Any, jax.config).update("jax_default_prng_impl", MAXTEXT_PRNG_IMPL)


def params_of(state: Any) -> dict[str, Any]:
    """The model's parameters of a train state (an ``nnx.State`` of MaxText's TrainStateNNX), as
    a nested dict of arrays in the scanned layout (``decoder/layers/...`` on axis 1)."""
    params, _ = nnx.split_state(state["model"], nnx.Param, ...)
    return params.to_pure_dict()


def train_batch(seed: int, step: int, rows: int) -> Batch:
    """Step `step`'s batch for MaxText's train step: `rows` fresh training prompts of the digit
    task (a function of seed and step), each followed by its verified answer; the loss sees the
    answer token only (``targets_segmentation``), as a policy's loss sees its completion."""
    prompts = task.train_prompts(seed, step, rows)
    sequences = np.concatenate([prompts, task.answers(prompts)], axis=1).astype(np.int32)
    length, used = config.SEQUENCE_LENGTH, sequences.shape[1]
    inputs = np.zeros((rows, length), np.int32)
    inputs[:, :used] = sequences
    targets = np.zeros((rows, length), np.int32)
    targets[:, : used - 1] = sequences[:, 1:]
    segments = np.zeros((rows, length), np.int32)
    segments[:, :used] = 1
    answer_only = np.zeros((rows, length), np.int32)
    answer_only[:, config.ANSWER_POSITION - 1] = 1  # predicts the token at ANSWER_POSITION
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy()
    return {
        "inputs": inputs,
        "inputs_position": positions,
        "inputs_segmentation": segments,
        "targets": targets,
        "targets_position": positions,
        "targets_segmentation": answer_only,
    }


@dataclass
class Trainer:
    """MaxText's trainer for one run, set up and compiled; `state` is its current train state
    (MaxText's checkpointer has restored the newest checkpoint of the run folder, if any)."""

    config: Any  # MaxText's HyperParameters
    checkpointer: Any  # Orbax v1 training Checkpointer
    mesh: jax.sharding.Mesh
    state: Any  # nnx.State of the TrainStateNNX
    step_fn: Any  # compiled (state, batch) -> (state, metrics)
    data_sharding: Any
    data_iterator: Any
    compile_s: float

    @property
    def restored_step(self) -> int:
        """Updates in the state: 0 fresh, the restored checkpoint's step after a resume."""
        return int(self.state["optimizer"]["step"].get_value())

    def step(self, batch: Batch) -> Mapping[str, Any]:
        """One optimizer update (dispatched: the arrays may still be computing)."""
        self.state, metrics = self.step_fn(self.state, jax.device_put(batch, self.data_sharding))
        return cast(Mapping[str, Any], metrics["scalar"])

    def params(self) -> dict[str, Any]:
        return params_of(self.state)

    def save(self, record: CheckpointRecord) -> None:
        """MaxText's own save of the current state as step ``record.step`` (async: returns once
        the arrays are copied to the host), with `record` in the step's metadata."""
        saved = checkpointing.save_checkpoint(
            WithRecord(self.checkpointer, record), record.step, self.state, self.config
        )
        if not saved:
            raise RuntimeError(f"step {record.step}: MaxText's checkpointer declined to save it")

    def wait_for_saves(self) -> None:
        checkpointing.wait_until_finished(self.checkpointer)

    def close(self) -> None:
        self.wait_for_saves()
        self.checkpointer.close()


def build_trainer(overrides: Mapping[str, Any]) -> Trainer:
    """MaxText's ``initialize`` and ``setup_train_loop`` for these settings, and its train step
    compiled for the batch's shape (before ``run_start``: compiling is not time-to-train)."""
    maxtext_config, goodput = maxtext_train.initialize(config.argv(overrides))
    (_, checkpointer, shardings, _, mesh, _, data_iterator, _, _, _, train_state) = (
        train_utils.setup_train_loop(maxtext_config, goodput)
    )
    graphdef, state = nnx.split(train_state)
    params_shardings, shardings = sharding.maybe_update_params_sharding_with_opt(
        maxtext_config, shardings
    )
    p_train_step, _ = train_utils.jit_train_and_eval_step(
        maxtext_config,
        graphdef,
        mesh,
        state,
        shardings,
        maxtext_train.train_step,
        maxtext_train.eval_step,
        None,
        params_shardings,
    )
    data_sharding = sharding.get_input_data_sharding(maxtext_config, mesh)
    started = time.perf_counter()
    with jax.set_mesh(mesh), logical_axis_rules(maxtext_config.logical_axis_rules):
        shaped = maxtext_utils.get_shaped_batch(maxtext_config, batch_sharding=data_sharding)
        compiled = p_train_step.lower(state, shaped).compile()
    return Trainer(
        config=maxtext_config,
        checkpointer=checkpointer,
        mesh=mesh,
        state=state,
        step_fn=compiled,
        data_sharding=data_sharding,
        data_iterator=data_iterator,
        compile_s=time.perf_counter() - started,
    )


def convert(model: config.ModelConfig, scanned_step: str, out_dir: str) -> str:
    """MaxText's ``generate_param_only_checkpoint`` of one committed scanned training step
    (unrolled, cast to bf16, parameters only) into ``out_dir``; the converted items' path."""
    use_maxtext_prng()
    overrides = config.convert_overrides(model, items_path(scanned_step), out_dir)
    maxtext_config = pyconfig.initialize(config.argv(overrides))
    generate_param_only_checkpoint.generate_decode_checkpoint(maxtext_config)
    return items_path(os.path.join(out_dir, "checkpoints", "0"))


@dataclass(frozen=True)
class Restored:
    """A model restored unscanned: its NNX graph, its state and its parameters (bf16)."""

    graphdef: Any
    state: Any
    mesh: jax.sharding.Mesh
    logical_axis_rules: Any

    def params(self) -> dict[str, Any]:
        params, _ = nnx.split_state(self.state, nnx.Param, ...)
        return params.to_pure_dict()


def restore(model: config.ModelConfig, unscanned_items: str, out_dir: str) -> Restored:
    """``model_creation_utils.from_pretrained`` of a converted checkpoint with
    ``scan_layers=false``; the weights stay the converter's bf16 (``weight_dtype``)."""
    use_maxtext_prng()
    overrides = {
        **config.restore_overrides(model, unscanned_items),
        "base_output_directory": out_dir,
        "weight_dtype": "bfloat16",
    }
    maxtext_config = pyconfig.initialize(config.argv(overrides))
    restored, mesh = model_creation_utils.from_pretrained(maxtext_config)
    graphdef, state = nnx.split(restored)
    return Restored(graphdef, state, mesh, maxtext_config.logical_axis_rules)


def next_token_logits(graphdef: Any, state: Any, prompts: jax.Array) -> jax.Array:
    """The model's logits for the token after each prompt ``(n, PROMPT_LENGTH)``: one forward
    pass over the prompt padded to MaxText's sequence length (padding is segment 0)."""
    model = nnx.merge(graphdef, state)
    rows, used = prompts.shape
    length = config.SEQUENCE_LENGTH
    tokens = jnp.zeros((rows, length), jnp.int32).at[:, :used].set(prompts)
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (rows, length))
    segments = jnp.zeros((rows, length), jnp.int32).at[:, :used].set(1)
    logits = model(
        decoder_input_tokens=tokens,
        decoder_positions=positions,
        decoder_segment_ids=segments,
        enable_dropout=False,
    )
    return cast(jax.Array, logits[:, used - 1, :].astype(jnp.float32))


def _sampler(graphdef: Any) -> Callable[..., jax.Array]:
    """The jitted sampler of one model (an NNX graph definition is not hashable: it is closed
    over, not passed as a static argument)."""

    def sample(
        state: Any, prompts: jax.Array, keys: jax.Array, temperature: jax.Array, top_p: jax.Array
    ) -> jax.Array:
        tokens = prompts
        for i in range(task.ANSWER_LENGTH):
            logits = filter_logits(next_token_logits(graphdef, state, tokens), temperature, top_p)
            step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, i)
            nxt = jax.vmap(jax.random.categorical)(step_keys, logits)
            tokens = jnp.concatenate([tokens, nxt[:, None].astype(tokens.dtype)], axis=1)
        return tokens[:, prompts.shape[1] :]

    return jax.jit(sample)


def answer_sampler(restored: Restored) -> Callable[[np.ndarray, jax.Array, float, float], Any]:
    """``(prompts, keys, temperature, top_p) -> answers`` of the restored model (one key per
    row; the answer's tokens sampled one at a time with `tpu_jobs.sampling.filter_logits`)."""
    sample = _sampler(restored.graphdef)

    def run(prompts: np.ndarray, keys: jax.Array, temperature: float, top_p: float) -> Any:
        with jax.set_mesh(restored.mesh), logical_axis_rules(restored.logical_axis_rules):
            return sample(
                restored.state,
                jnp.asarray(prompts, dtype=jnp.int32),
                keys,
                jnp.float32(temperature),
                jnp.float32(top_p),
            )

    return run


def tree_shapes(tree: Any) -> Sequence[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of every leaf, sorted by name (for messages and tests)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return sorted(
        (jax.tree_util.keystr(p, simple=True, separator="/"), tuple(x.shape), str(x.dtype))
        for p, x in leaves
    )
