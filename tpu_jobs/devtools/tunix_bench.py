"""Bench of the Tunix job: what Tunix's per-step checkpoints and rcpflow's recording cost a step.

    python -m tpu_jobs.devtools.tunix_bench [--rounds 3] [--steps 14] [--warmup 3]

Three variants of the same run (toy task, gbs 256, seed 0), each a fresh RLCluster trained for
``--steps`` updates, run in interleaved blocks (round r runs all three, in an order rotated per
round) so machine noise hits them alike:

    plain        no checkpoints at all
    checkpoints  Tunix's checkpoint manager saving every step (async), no recording
    recorded     the same plus rcpflow's recording (`tpu_jobs.tunix.train.StepRecording`: the
                 block on the new parameters, the timestamp, the weights fingerprint, the
                 checkpoint record, the commit watcher and its manifest rows, the MLLOG)

A step's time is the time from one rollout's start to the next's (one timestamp per step, taken
in ``RLCluster.generate``; the same probe in every variant); the first ``--warmup`` steps
(compilation) are left out, and so is the drain at the end (Tunix's close waiting for the last
write). Prints one JSON line per block, then the medians and their ratios.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from tunix.rl import rl_cluster as rlc

from rcpflow import recipe
from rcpflow.mllog import SystemInfo
from tpu_jobs.tunix import train
from tpu_jobs.tunix.interim_recorder import TrainingRecorder

VARIANTS = ("plain", "checkpoints", "recorded")


def one_block(variant: str, steps: int, warmup: int) -> list[float]:
    starts: list[float] = []
    generate = rlc.RLCluster.generate

    def probe(self: rlc.RLCluster, *args: Any, **kwargs: Any) -> Any:
        starts.append(time.perf_counter())
        return generate(self, *args, **kwargs)

    rlc.RLCluster.generate = probe  # the same probe in every variant
    try:
        with tempfile.TemporaryDirectory(prefix=f"tunix-bench-{variant}-") as run_dir:
            config = train.TrainConfig(run_dir=run_dir, seed=0, max_steps=steps, val_start_at=1)
            hp = train.hyperparameters_for(config)
            root = None if variant == "plain" else f"{run_dir}/{train.CHECKPOINT_ROOT}"
            job = train.build_job(config, hp, 1, root)
            recording = None
            if variant == "recorded":
                assert root is not None
                recorder = TrainingRecorder(
                    run_dir,
                    seed=0,
                    hyperparameters=hp,
                    val_start_at=1,
                    system=SystemInfo(micro_batch_size=hp.global_batch_size),
                )
                recorder.on_init_start()
                recording = train.StepRecording(
                    recorder,
                    job.trainer,
                    val_start_at=1,
                    checkpoint_root=root,
                    identity=train.run_identity(config, hp, 1),
                    policy_config=config.policy,
                    last_step=0,
                )
                recorder.on_run_start()
            job.learner.train(train.batches(0, hp, job.rollout))
            if recording is not None:
                recording.finish()
                recorder.on_train_end()
    finally:
        rlc.RLCluster.generate = generate
    return [b - a for a, b in itertools.pairwise(starts[warmup:])]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tpu_jobs.devtools.tunix_bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    if args.steps < args.warmup + 2:
        ap.error("--steps must leave at least two timed steps after --warmup")
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
        for variant in order:
            block = one_block(variant, args.steps, args.warmup)
            times[variant].extend(block)
            median = round(statistics.median(block), 4)
            print(json.dumps({"round": r, "variant": variant, "median_step_s": median}), flush=True)
    med = {v: statistics.median(t) for v, t in times.items()}
    print(
        json.dumps(
            {
                "median_step_s": {v: round(m, 4) for v, m in med.items()},
                "checkpoints/plain": round(med["checkpoints"] / med["plain"], 3),
                "recorded/checkpoints": round(med["recorded"] / med["checkpoints"], 3),
                "recorded/plain": round(med["recorded"] / med["plain"], 3),
                "steps_timed_per_variant": len(times["plain"]),
                "gbs": recipe.REFERENCE_BATCH_SIZE,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
