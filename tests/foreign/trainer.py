"""A foreign trainer for tests: not rcpflow's toy, no JAX, its own checkpoint format.

A FIXTURE, not a learner: each "checkpoint" is a folder ``<ckpt-root>/step-<N>/`` holding
``weights.json`` with a precomputed skill curve, ``skill = skill_start + skill_per_step * N``
(clipped to [0, 1]), beside the step, samples and weight-update time (as Tunix puts its own
metadata into each checkpoint). `tests/foreign/evaluator.py` turns a skill into attempt outcomes,
so the numbers a run is decided on come from what this trainer saved.

What it shares with any real trainer is the rcpflow contract: the MLLOG training section and the
weight-update timestamps through `rcpflow.trainer.recorder.TrainingRecorder`, and a manifest row per
committed checkpoint, either through the recorder (``--rows recorder``) or, as a trainer that is
not Python would, through ``python -m rcpflow manifest add`` (``--rows cli``).

    python tests/foreign/trainer.py --run-dir D --ckpt-root C --seed 1 --global-batch-size 16 \
        --max-steps 6 --val-start-at 2 --division open [--rows cli]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from rcpflow import recipe
from rcpflow.trainer.recorder import TrainingRecorder

try:
    from trainer_args import add_run_arguments, skill  # run as a script: tests/foreign on sys.path
except ImportError:
    from foreign.trainer_args import add_run_arguments, skill

CHECKPOINT_FORMAT = "rcpflow-tests-foreign-trainer/1"


def save_checkpoint(root: str, step: int, content: dict[str, object]) -> str:
    """Write the step's folder atomically (a rename), as a checkpointer commits."""
    final = os.path.join(root, f"step-{step:04d}")
    tmp = final + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    with open(os.path.join(tmp, "weights.json"), "w") as f:
        json.dump(content, f, sort_keys=True)
    os.replace(tmp, final)
    return final


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True)
    p.add_argument("--ckpt-root", required=True)
    add_run_arguments(p)
    p.add_argument("--rows", choices=("recorder", "cli"), default="recorder")
    args = p.parse_args(argv)

    hp = recipe.hyperparameters(args.division, args.global_batch_size, args.max_steps)
    rec = TrainingRecorder(
        args.run_dir, seed=args.seed, hyperparameters=hp, val_start_at=args.val_start_at
    )
    resumed = rec.resume()
    first = 1 if resumed is None or resumed.step is None else resumed.step + 1
    rec.on_init_start()
    rec.on_run_start()
    for step in range(first, args.max_steps + 1):
        time.sleep(0.01)  # "the update"
        ts = rec.on_update(step)
        if step < args.val_start_at:
            continue
        path = save_checkpoint(
            args.ckpt_root,
            step,
            {
                "format": CHECKPOINT_FORMAT,
                "global_step": step,
                "samples_count": step * args.global_batch_size,
                "timestamp_ms": ts,
                "skill": skill(step, args.skill_start, args.skill_per_step),
            },
        )
        if args.rows == "recorder":
            rec.on_checkpoint_committed(step, path)
        else:
            add = [sys.executable, "-m", "rcpflow", "manifest", "add", args.run_dir]
            add += ["--step", str(step), "--checkpoint", path, "--timestamp-ms", str(ts)]
            add += ["--seed", str(args.seed), "--val-start-at", str(args.val_start_at)]
            subprocess.run(add, check=True)
        print(f"step {step}: saved {path}", flush=True)
    rec.on_train_end()
    return 0


if __name__ == "__main__":
    sys.exit(main())
