"""GRPO for the toy task: group-relative advantages, one on-policy policy-gradient update per step.

Per step the trainer draws ``hp.num_prompts_per_step`` prompts, samples
``hp.num_generations_per_prompt`` (16) answers for each at the training temperature/top_p,
scores them with the task's exact reward, and normalises rewards within each prompt's group:
``A = (r - mean_group) / (std_group + eps)``. The loss is ``-mean(A * log pi(answer))`` over
all generations (token-mean inside an answer). Each batch is used for exactly one update, so
the PPO-style importance ratio is 1 and its clipping never acts; there is no KL term (the recipe
has none to log). The optimizer is `tpu_jobs.rcp.optimizer.make_optimizer`'s.

Everything random is derived from ``(seed, step)`` so a run resumed at step ``s`` continues the
trajectory it would have had without the interruption.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rcpflow.recipe import Hyperparameters
from tpu_jobs import task
from tpu_jobs.rcp.optimizer import make_optimizer
from tpu_jobs.sampling import sample_tokens
from tpu_jobs.toy.model import ModelConfig, Params, apply_scanned, init_params, scanned_logits_fn

ADVANTAGE_EPS = 1e-6

_PARAMS_STREAM = 0
_ROLLOUT_STREAM = 1


class TrainState(NamedTuple):
    """Parameters and optimizer state after ``step`` updates (a pytree; ``step`` is an int32)."""

    step: jax.Array
    params: Params
    opt_state: optax.OptState


class StepMetrics(NamedTuple):
    mean_reward: jax.Array
    loss: jax.Array
    grad_norm: jax.Array


def group_advantages(rewards: jax.Array, eps: float = ADVANTAGE_EPS) -> jax.Array:
    """``(prompts, generations)`` rewards -> advantages normalised within each prompt's group.

    Uses the population standard deviation; a group whose rewards are all equal gets advantage 0.
    """
    mean = rewards.mean(axis=-1, keepdims=True)
    std = rewards.std(axis=-1, keepdims=True)
    return (rewards - mean) / (std + eps)


def completion_logprobs(
    cfg: ModelConfig, params: Params, prompts: jax.Array, completions: jax.Array
) -> jax.Array:
    """Log-probability of each completion token given everything before it: ``(batch, answer)``."""
    tokens = jnp.concatenate([prompts, completions], axis=1)
    logits = apply_scanned(cfg, params, tokens[:, :-1])
    start = prompts.shape[1] - 1
    logp = jax.nn.log_softmax(logits[:, start:, :], axis=-1)
    return jnp.take_along_axis(logp, completions[..., None], axis=-1)[..., 0]


def policy_gradient_loss(
    cfg: ModelConfig,
    params: Params,
    prompts: jax.Array,
    completions: jax.Array,
    advantages: jax.Array,
) -> jax.Array:
    """``-mean_i(A_i * mean_t log pi(y_it))``; advantages are constants (no gradient)."""
    logp = completion_logprobs(cfg, params, prompts, completions).mean(axis=-1)
    return -(jax.lax.stop_gradient(advantages) * logp).mean()


def init_state(cfg: ModelConfig, hp: Hyperparameters, seed: int) -> TrainState:
    params = init_params(cfg, jax.random.fold_in(jax.random.key(seed), _PARAMS_STREAM))
    return TrainState(step=jnp.int32(0), params=params, opt_state=make_optimizer(hp).init(params))


def rollout_key(seed: int, step: int | jax.Array) -> jax.Array:
    """The sampling key of update number ``step`` (1-based), a pure function of seed and step."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), _ROLLOUT_STREAM), step)


# Jitted ``(state, prompts, key) -> (state, metrics)``; `.lower(...).compile()` compiles it ahead.
TrainStep = jax.stages.Wrapped


@cache
def make_train_step(cfg: ModelConfig, hp: Hyperparameters) -> TrainStep:
    """A jitted ``(state, prompts, key) -> (state, metrics)``: rollouts, rewards, one update.

    ``prompts`` is ``(hp.num_prompts_per_step, task.PROMPT_LENGTH)``. Cached per settings, so
    callers share one compiled program.
    """
    return jax.jit(train_step_fn(cfg, hp))


def sharded_train_step(
    cfg: ModelConfig,
    hp: Hyperparameters,
    seed: int,
    state_shardings: Any,
    metrics_sharding: jax.sharding.Sharding,
) -> TrainStep:
    """A jitted ``(state, prompts, step) -> (state, metrics)`` whose state keeps
    `state_shardings` and whose metrics are laid out as `metrics_sharding` (replicated); the
    rollout key is `rollout_key(seed, step)`, derived on device from the int32 ``step``."""
    step_fn = train_step_fn(cfg, hp)

    def sharded(
        state: TrainState, prompts: jax.Array, step: jax.Array
    ) -> tuple[TrainState, StepMetrics]:
        return step_fn(state, prompts, rollout_key(seed, step))

    return jax.jit(sharded, out_shardings=(state_shardings, metrics_sharding))


def train_step_fn(
    cfg: ModelConfig, hp: Hyperparameters
) -> Callable[[TrainState, jax.Array, jax.Array], tuple[TrainState, StepMetrics]]:
    """The un-jitted ``(state, prompts, key) -> (state, metrics)`` of `make_train_step`."""
    optimizer = make_optimizer(hp)
    generations = hp.num_generations_per_prompt
    logits_fn = scanned_logits_fn(cfg)

    def train_step(
        state: TrainState, prompts: jax.Array, key: jax.Array
    ) -> tuple[TrainState, StepMetrics]:
        batch_prompts = jnp.repeat(prompts, generations, axis=0)
        completions = sample_tokens(
            logits_fn,
            state.params,
            batch_prompts,
            key,
            answer_length=task.ANSWER_LENGTH,
            temperature=jnp.float32(hp.train_temperature),
            top_p=jnp.float32(hp.train_top_p),
        )
        rewards = task.rewards(batch_prompts, completions).reshape(-1, generations)
        advantages = group_advantages(rewards).reshape(-1)
        loss, grads = jax.value_and_grad(
            lambda p: policy_gradient_loss(cfg, p, batch_prompts, completions, advantages)
        )(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = StepMetrics(
            mean_reward=rewards.mean(), loss=loss, grad_norm=optax.tree.norm(grads)
        )
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def prompts_for_step(hp: Hyperparameters, seed: int, step: int) -> np.ndarray:
    """Training prompts of update number ``step`` (1-based)."""
    return task.train_prompts(seed, step, hp.num_prompts_per_step)
