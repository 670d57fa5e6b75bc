"""One optimizer for both trainers (`tpu_jobs.rcp.optimizer`): what a run's MLLOG says about its
optimizer (``opt_*``) is what the trainer built, and a schedule it cannot build is refused."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.records.mllog import read_events
from tpu_jobs.rcp import optimizer

pytestmark = pytest.mark.timeout(900)


def test_a_schedule_or_warmup_it_does_not_build_is_refused() -> None:
    hp = recipe.hyperparameters("open", 32, 4, learning_rate=1e-3)
    optimizer.make_optimizer(hp)
    for changed in ({"warmup_steps": 3}, {"lr_schedule": "cosine"}):
        with pytest.raises(ValueError, match="only a constant schedule without warmup"):
            optimizer.make_optimizer(dataclasses.replace(hp, **changed))


def logged_optimizer(run_dir: str, seed: int) -> optax.GradientTransformation:
    """The optimizer the run's MLLOG describes, built here from its ``opt_*`` values alone."""
    logged = {e.key: e.value for e in read_events(RunLayout(run_dir).mllog(seed))}
    assert logged["opt_name"] == "adamw"
    assert logged["opt_learning_rate_decay_schedule"] == "constant"
    assert logged["opt_learning_rate_warmup_steps"] == 0
    return optax.chain(
        optax.clip_by_global_norm(logged["opt_gradient_clip_norm"]),
        optax.adamw(
            learning_rate=logged["opt_base_learning_rate"],
            b1=logged["opt_adamw_beta_1"],
            b2=logged["opt_adamw_beta_2"],
            eps=logged["opt_adamw_epsilon"],
            weight_decay=logged["opt_adamw_weight_decay"],
        ),
    )


def same_updates(a: optax.GradientTransformation, b: optax.GradientTransformation) -> None:
    """Three updates of `a` and `b` on the same params and gradients agree."""
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32), "b": jnp.zeros(3)}
    state_a, state_b = a.init(params), b.init(params)
    for _ in range(3):
        grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape) * 5, p.dtype), params)
        up_a, state_a = a.update(grads, state_a, params)
        up_b, state_b = b.update(grads, state_b, params)
        for x, y in zip(jax.tree.leaves(up_a), jax.tree.leaves(up_b), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        params = optax.apply_updates(params, up_a)


def spy_on(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[optax.GradientTransformation]:
    built: list[optax.GradientTransformation] = []

    def spy(hp: recipe.Hyperparameters) -> optax.GradientTransformation:
        built.append(optimizer.make_optimizer(hp))
        return built[-1]

    monkeypatch.setattr(module, "make_optimizer", spy)
    return built


@pytest.mark.parametrize(
    "division_flags", [{}, {"division": "open", "learning_rate": 0.02}, {"division": "closed"}]
)
def test_toy_trainer_logs_the_optimizer_it_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, division_flags: dict[str, Any]
) -> None:
    from tpu_jobs.toy import grpo, train

    grpo.make_train_step.cache_clear()  # build it again, through the spy
    built = spy_on(monkeypatch, grpo)
    run_dir = str(tmp_path / "run")
    train.train(
        train.TrainConfig(
            run_dir=run_dir, seed=0, global_batch_size=32, max_steps=2, val_start_at=2,
            **division_flags,
        )
    )  # fmt: skip
    grpo.make_train_step.cache_clear()  # no spy left in the cache for other tests
    assert built  # the state and the train step both got theirs from make_optimizer
    for one in built:
        same_updates(one, logged_optimizer(run_dir, 0))


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("tunix") is None, reason="google-tunix (`tunix` extra) not installed"
)
def test_tunix_trainer_logs_the_optimizer_it_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpu_jobs.tunix import train

    built = spy_on(monkeypatch, train)
    run_dir = str(tmp_path / "run")
    job_optimizers: list[Any] = []
    build_job = train.build_job

    def keep(*args: Any, **kwargs: Any) -> Any:
        job = build_job(*args, **kwargs)
        job_optimizers.append(job.cluster.cluster_config.training_config.actor_optimizer)
        return job

    monkeypatch.setattr(train, "build_job", keep)
    train.train(
        train.TrainConfig(
            run_dir=run_dir, seed=0, global_batch_size=32, max_steps=2, val_start_at=2,
            learning_rate=0.02,
        )
    )  # fmt: skip
    assert len(built) == 1 and job_optimizers == built  # what Tunix was given is what was built
    same_updates(built[0], logged_optimizer(run_dir, 0))
