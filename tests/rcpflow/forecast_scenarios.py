"""The forecast tests' scenarios: the seed's figures and the proportions bench's scaled copy."""

from __future__ import annotations

from dataclasses import replace

from rcpflow.planning.forecast import Scenario

# The seed's figures: a step 185 s, an evaluation 1,700 s on 64 chips, training on 128.
SEED = Scenario(
    step_seconds=185.0,
    eval_seconds=1700.0,
    val_start_at=18,
    max_steps=60,
    passing_step=20,
    schedule="after_training",
    window=1,
    train_chips=128,
    eval_chips=64,
)

# The rehearsal jobs at 1/100 (the proportions bench): a step 1.85 s, an evaluation 17 s, with
# a task start of 1 s and waits polling every 0.5 s.
SMALL = replace(
    SEED, step_seconds=1.85, eval_seconds=17.0, task_start_seconds=1.0, poll_seconds=0.5
)
