"""The toy task: a fixed 251-instance eval set, seeded training prompts disjoint from it, and an
exact reward."""

from __future__ import annotations

import numpy as np
import pytest

from rcpflow.recipe import EVAL_SAMPLES
from tpu_jobs import task


def test_eval_set_has_251_distinct_instances_with_correct_answers() -> None:
    prompts = task.eval_prompts()
    assert prompts.shape == (EVAL_SAMPLES, task.PROMPT_LENGTH) and EVAL_SAMPLES == 251
    assert prompts.dtype == np.int32
    assert len({tuple(p) for p in prompts.tolist()}) == 251
    correct = np.asarray(task.answers(prompts))
    assert correct.shape == (251, task.ANSWER_LENGTH)
    for prompt, answer in zip(prompts.tolist(), correct.tolist(), strict=True):
        assert prompt[0] == task.BOS and prompt[-1] == task.SEP
        assert all(0 <= d <= 9 for d in prompt[1:-1])
        # Independent restatement of the rule: successor of the last digit.
        assert answer == [(prompt[-2] + 1) % 10]
    # the order is fixed (an instance's index is its row): every call gives the same rows
    np.testing.assert_array_equal(task.eval_prompts(), prompts)


def test_eval_set_is_fixed_and_read_only() -> None:
    # Fixed seed, independent of the training seed: the same bytes in every process.
    prompts = task.eval_prompts()
    fresh = np.random.default_rng(task.EVAL_SEED).choice(10**task.NUM_DIGITS, 251, replace=False)
    np.testing.assert_array_equal(prompts[:, 1:-1] @ [1000, 100, 10, 1], fresh)
    with pytest.raises(ValueError):
        prompts[0, 1] = 3


def test_train_prompts_are_a_function_of_seed_and_step() -> None:
    a = task.train_prompts(seed=1, step=5, num_prompts=16)
    np.testing.assert_array_equal(a, task.train_prompts(seed=1, step=5, num_prompts=16))
    assert a.shape == (16, task.PROMPT_LENGTH) and a.dtype == np.int32
    assert not np.array_equal(a, task.train_prompts(seed=1, step=6, num_prompts=16))
    assert not np.array_equal(a, task.train_prompts(seed=2, step=5, num_prompts=16))


def test_train_prompts_never_equal_an_eval_prompt() -> None:
    held_out = {tuple(p) for p in task.eval_prompts().tolist()}
    drawn = np.concatenate([task.train_prompts(0, step, 512) for step in range(1, 41)])
    # 20k draws from 10k strings: without the exclusion about 2.5% would be eval prompts.
    assert not held_out & {tuple(p) for p in drawn.tolist()}
    # ... and the training distribution still covers every answer.
    assert set(np.asarray(task.answers(drawn)).ravel()) == set(range(10))


def test_reward_is_exact_match() -> None:
    prompt = (task.BOS, 3, 1, 4, 9, task.SEP)
    assert task.reward(prompt, (0,)) == 1.0
    for wrong in [(9,), (1,), (task.SEP,), (0, 0), ()]:
        assert task.reward(prompt, wrong) == 0.0
    prompts = np.array([prompt, prompt, prompt], dtype=np.int32)
    np.testing.assert_array_equal(task.rewards(prompts, np.array([[0], [5], [0]])), [1, 0, 1])
    with pytest.raises(ValueError, match="prompt must have 6 tokens"):
        task.reward((3, 1, 4), (5,))


def test_train_prompts_rejects_empty_request() -> None:
    with pytest.raises(ValueError, match="num_prompts"):
        task.train_prompts(0, 1, 0)
