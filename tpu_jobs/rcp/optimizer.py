"""The optimizer the recipe's hyperparameters describe, for every trainer (`make_optimizer`).

The MLLOG states these hyperparameters (``opt_*``), so a trainer builds its optimizer here and
nowhere else: what is logged is what is used.
"""

from __future__ import annotations

import optax

from rcpflow.recipe import Hyperparameters


def make_optimizer(hp: Hyperparameters) -> optax.GradientTransformation:
    """Clip by global norm, then AdamW at a constant learning rate. Other schedules or a warmup
    are refused: they are not implemented, and logging them would misdescribe the run."""
    if hp.lr_schedule != "constant" or hp.warmup_steps != 0:
        raise ValueError(
            f"only a constant schedule without warmup is implemented; hyperparameters say "
            f"lr_schedule={hp.lr_schedule!r}, warmup_steps={hp.warmup_steps}"
        )
    return optax.chain(
        optax.clip_by_global_norm(hp.gradient_clip_norm),
        optax.adamw(
            learning_rate=hp.learning_rate,
            b1=hp.adam_beta_1,
            b2=hp.adam_beta_2,
            eps=hp.adam_epsilon,
            weight_decay=hp.weight_decay,
        ),
    )
