"""The Tunix trainer's evaluator (``python -m tpu_jobs.tunix_evaluate``): `TunixCheckpoints` for
the shared evaluator (`tpu_jobs.eval.cli`: flags, exit codes; one worker only, no sharding flags).

The actor's parameters are restored from Tunix's layout as numpy arrays into a Qwen3 of the size
the checkpoint's record names, their fingerprint checked against the one recorded at save; all
1004 attempts are sampled in one call of one shape with the project's sampler
(`tpu_jobs.sampling.filter_logits` on the Qwen3's next-token logits), so a rerun gives the same
bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rcpflow import recipe
from tpu_jobs import task
from tpu_jobs.eval import cli
from tpu_jobs.eval.attempts import attempt_keys, attempt_rows, pad_rows, scored
from tpu_jobs.eval.shards import Record
from tpu_jobs.eval.target import CheckpointFacts, LoadedCheckpoint
from tpu_jobs.rcp.fingerprint import FingerprintMismatchError, fingerprint_as
from tpu_jobs.sampling import filter_logits
from tpu_jobs.tunix import checkpoints, policy

PROG = "python -m tpu_jobs.tunix_evaluate"
BATCH_ROWS = 1024  # >= 251 x 4, a multiple of the mesh's devices: one sampler call, one shape


@cache
def _sampler(config: policy.ModelConfig) -> Any:
    """The jitted sampler for one policy size (nnx graph definitions are not hashable, so the
    structure is closed over instead of passed as a static argument)."""
    graphdef, _ = nnx.split(policy.abstract(config))

    def sample(
        state: Any, prompts: jax.Array, keys: jax.Array, temperature: jax.Array, top_p: jax.Array
    ) -> jax.Array:
        model = nnx.merge(graphdef, state)
        tokens = prompts
        for i in range(task.ANSWER_LENGTH):
            logits = filter_logits(policy.last_logits(model, tokens), temperature, top_p)
            step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, i)
            nxt = jax.vmap(jax.random.categorical)(step_keys, logits)
            tokens = jnp.concatenate([tokens, nxt[:, None].astype(tokens.dtype)], axis=1)
        return tokens[:, prompts.shape[1] :]

    return jax.jit(sample)


def load_policy(
    path: str, expected: str | None
) -> tuple[policy.ModelConfig, Any, checkpoints.CheckpointRecord]:
    """(policy size, nnx state, record) of a committed Tunix step, its weights verified."""
    _, record = checkpoints.read_record(path)
    if expected is not None and expected != record.weights_fingerprint:
        raise FingerprintMismatchError(
            f"{path}: checkpoint records fingerprint {record.weights_fingerprint}, the manifest "
            f"expects {expected}: not the checkpoint the manifest recorded"
        )
    params = checkpoints.restore_params(path)
    got = fingerprint_as(params, record.weights_fingerprint)  # also an earlier sha256 one
    if got != record.weights_fingerprint:
        raise FingerprintMismatchError(
            f"{path}: restored weights have fingerprint {got}, recorded at save "
            f"{record.weights_fingerprint}: corrupted or not this checkpoint; refusing to score"
        )
    config = policy.ModelConfig.from_json(record.policy, where=path)
    _, state = nnx.split(policy.abstract(config))
    state.replace_by_pure_dict(jax.tree.map(jnp.asarray, params))
    return config, state, record


def run_attempts(config: policy.ModelConfig, state: Any, instances: Sequence[int]) -> list[Record]:
    """4 attempts at each of `instances`, in one sampler call of `BATCH_ROWS` rows."""
    rows = attempt_rows(instances)
    if not rows:
        return []
    prompts = task.eval_prompts()[[i for i, _ in rows]]
    batch, batch_keys = pad_rows(prompts, attempt_keys(rows), BATCH_ROWS)
    with jax.set_mesh(policy.mesh()):
        sampled = _sampler(config)(
            state,
            jnp.asarray(batch, dtype=jnp.int32),
            batch_keys,
            temperature=jnp.float32(recipe.EVAL_TEMPERATURE),
            top_p=jnp.float32(recipe.EVAL_TOP_P),
        )
    return scored(rows, prompts, np.asarray(sampled)[: len(rows)])


class TunixCheckpoints:
    """The Tunix trainer's checkpoints (`tpu_jobs.tunix.checkpoints`)."""

    batch_rows = BATCH_ROWS
    # `checkpoints.restore_params` reads the whole actor on one host as numpy.
    multi_process = False

    def load(self, path: str, expected_fingerprint: str | None) -> LoadedCheckpoint:
        config, state, record = load_policy(path, expected_fingerprint)
        samples = record.step * int(record.run["global_batch_size"])
        return LoadedCheckpoint(
            facts=CheckpointFacts(record.step, record.timestamp_ms, samples),
            attempts=lambda instances: run_attempts(config, state, instances),
        )


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(
        argv,
        TunixCheckpoints(),
        prog=PROG,
        description="Evaluating a Tunix checkpoint: pass@4 on 251 instances.",
        checkpoint_help="standalone: one Tunix step folder (.../actor/<step>)",
        sharded=False,
    )
