"""Recipe math against the numbers the official 6.1.0 checker derives."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rcpflow import recipe


@pytest.mark.parametrize(("gbs", "step"), [(256, 18), (512, 10), (1024, 7), (128, 33)])
def test_val_start_at_known_points(gbs, step):
    assert recipe.val_start_at(gbs) == step


@given(st.integers(min_value=1, max_value=1 << 20))
def test_val_start_at_formula(gbs):
    assert recipe.val_start_at(gbs) == math.ceil(2.5 + 3840 / gbs)
    assert recipe.val_start_at(gbs) >= 3


@given(st.integers(min_value=1, max_value=4096), st.integers(min_value=-5, max_value=100))
def test_override_only_when_positive(gbs, override):
    got = recipe.val_start_at(gbs, override)
    assert got == (override if override > 0 else recipe.val_start_at(gbs))


@given(st.integers(min_value=1, max_value=256).map(lambda p: p * 16))
def test_closed_hyperparameters_match_checker(gbs):
    hp = recipe.hyperparameters("closed", gbs, max_steps=50)
    # the closed yaml's own expressions
    assert abs(hp.learning_rate - 1.0e-6 * (gbs / 256) ** 0.5) < 1e-9
    assert abs(hp.gradient_clip_norm - 0.125 * (256 / gbs) ** 0.5) < 1e-9
    assert hp.num_prompts_per_step * hp.num_generations_per_prompt == gbs
    assert hp.num_generations_per_prompt == 16
    assert (hp.max_sequence_length, hp.eval_samples, hp.init_checkpoint_step) == (65536, 251, 0)
    assert (hp.adam_beta_1, hp.adam_beta_2, hp.adam_epsilon, hp.weight_decay) == (
        0.9,
        0.999,
        1e-8,
        0.0,
    )
    assert (hp.train_temperature, hp.train_top_p) == (1.0, 1.0)
    assert (hp.eval_temperature, hp.eval_top_p) == (0.1, 0.95)
    assert (hp.warmup_steps, hp.lr_schedule) == (0, "constant")


def test_closed_refuses_other_learning_rate():
    with pytest.raises(ValueError, match="closed division pins learning_rate"):
        recipe.hyperparameters("closed", 256, 10, learning_rate=3e-3)
    # the recipe's own value is accepted
    assert recipe.hyperparameters("closed", 256, 10, learning_rate=1e-6).learning_rate == 1e-6


def test_open_uses_given_learning_rate():
    hp = recipe.hyperparameters("open", 256, 10, learning_rate=3e-3, gradient_clip_norm=1.0)
    assert (hp.learning_rate, hp.gradient_clip_norm) == (3e-3, 1.0)


@pytest.mark.parametrize("gbs", [0, -16, 100, 8, 255])
def test_bad_global_batch_size_is_named(gbs):
    with pytest.raises(ValueError, match="global_batch_size"):
        recipe.hyperparameters("open", gbs, 10)


def test_bad_division():
    with pytest.raises(ValueError, match="division"):
        recipe.hyperparameters("mixed", 256, 10)  # type: ignore[arg-type]


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), 2.0, 0.0])
def test_an_open_learning_rate_is_finite_and_bounded(lr):
    with pytest.raises(ValueError, match=r"learning_rate .* must be a number in"):
        recipe.hyperparameters("open", 256, 10, learning_rate=lr)
