"""A minimal stand-in trainer that drives `RcpHooks` the way any trainer would, for tests.

It is deliberately not the toy GRPO trainer: the hooks must work for a loop they know nothing
about. The "model" is a stacked (scanned-layout) pytree updated by a jitted step; the trainer
state is an optimizer-like pytree plus a raw PRNG key.

    python hooks_driver.py RUN_DIR --seed S --gbs G --max-steps M --val-start-at V
        [--crash-at-commit STEP]   die (os._exit) while Orbax commits STEP's checkpoint
        [--crash-after-save STEP]  die after STEP's checkpoint committed, before its row is written

Prints one JSON line per update: {"step", "timestamp_ms", "resumed_from"}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp

from rcpflow import recipe
from tpu_jobs.rcp.callbacks import RcpHooks
from tpu_jobs.rcp.checkpoint_format import SavedCheckpoint

NUM_LAYERS = 3
CRASH_EXIT_CODE = 17


def init(seed: int) -> tuple[dict, dict]:
    key = jax.random.PRNGKey(seed)
    params = {
        "embed": {"embedding": jax.random.normal(key, (16, 8))},
        # Stacked on axis 1, as MaxText and tpu_jobs.toy.model lay out scanned layers.
        "layers": {
            "mlp": {"kernel": jax.random.normal(jax.random.fold_in(key, 1), (8, NUM_LAYERS, 8))},
            "norm": {"scale": jnp.ones((8, NUM_LAYERS))},
        },
    }
    state = {"momentum": jax.tree.map(jnp.zeros_like, params), "rng": jax.random.PRNGKey(seed + 1)}
    return params, state


@jax.jit
def train_step(params: dict, state: dict) -> tuple[dict, dict]:
    rng, sub = jax.random.split(state["rng"])
    leaves, treedef = jax.tree.flatten(params)
    noise = jax.tree.unflatten(
        treedef,
        [jax.random.normal(jax.random.fold_in(sub, i), x.shape) for i, x in enumerate(leaves)],
    )
    momentum = jax.tree.map(lambda m, g: 0.9 * m + g, state["momentum"], noise)
    params = jax.tree.map(lambda p, m: p - 1e-2 * m, params, momentum)
    return params, {"momentum": momentum, "rng": rng}


def install_commit_crash(step: int) -> None:
    """Kill the process when Orbax is about to mark `step`'s checkpoint complete: the data is
    written, the commit is not (what a preemption in the middle of a save leaves)."""
    from orbax.checkpoint._src.path import atomicity

    for cls in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
        original = cls.finalize

        async def finalize(self, _original=original) -> None:
            if self.get_final().name == str(step):
                os._exit(CRASH_EXIT_CODE)
            await _original(self)

        cls.finalize = finalize


def install_row_crash(step: int) -> None:
    """Kill the process in the saver's thread once `step`'s checkpoint has committed, just
    before its manifest row is upserted."""
    original = RcpHooks._on_commit

    def record_row(self: RcpHooks, saved: SavedCheckpoint) -> None:
        if saved.step == step:
            os._exit(CRASH_EXIT_CODE)
        original(self, saved)

    RcpHooks._on_commit = record_row


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gbs", type=int, default=32)
    ap.add_argument("--max-steps", type=int, default=6)
    ap.add_argument("--val-start-at", type=int, default=3)
    ap.add_argument("--crash-at-commit", type=int)
    ap.add_argument("--crash-after-save", type=int)
    args = ap.parse_args(argv)
    if args.crash_at_commit is not None:
        install_commit_crash(args.crash_at_commit)
    if args.crash_after_save is not None:
        install_row_crash(args.crash_after_save)

    hp = recipe.hyperparameters("closed", args.gbs, args.max_steps)
    hooks = RcpHooks(
        args.run_dir, args.seed, hp, args.val_start_at, checkpoint_extra={"driver": "hooks_driver"}
    )
    params, state = init(args.seed)
    resumed = hooks.resume(params_like=params, state_like=state)
    first = 1
    if resumed is not None:
        params, state, first = resumed.params, resumed.state, resumed.step + 1
    hooks.on_init_start()
    hooks.on_run_start()
    with hooks:
        for step in range(first, hp.max_steps + 1):
            params, state = train_step(params, state)
            ts = hooks.after_update(step, params, state)
            print(json.dumps({"step": step, "timestamp_ms": ts,
                              "resumed_from": None if resumed is None else resumed.step}),
                  flush=True)  # fmt: skip
        hooks.on_train_end()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
