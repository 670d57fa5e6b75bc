"""Bench of the Tunix job: what Tunix's per-step checkpoints and rcpflow's recording cost a step.

    python -m devtools.bench.tunix_bench [--rounds 4] [--steps 20] [--warmup 3]
        [--output BENCHMARKS.md]

Three variants of the same run (toy task, gbs 256, seed 0), each a fresh RLCluster trained for
``--steps`` updates, run in interleaved blocks (round r runs all three, in an order rotated per
round) so machine noise hits them alike:

    plain        no checkpoints at all
    checkpoints  Tunix's checkpoint manager saving every step (async), no recording
    recorded     the same plus rcpflow's recording (`tpu_jobs.tunix.recording.StepRecording`: the
                 block on the new parameters, the timestamp, the weights fingerprint, the
                 checkpoint record, the commit watcher and its manifest rows, the MLLOG)

A step's time is the time from one rollout's start to the next's (one timestamp per step, taken
in ``RLCluster.generate``; the same probe in every variant); the first ``--warmup`` steps
(compilation) are left out, and so is the drain at the end (Tunix's close waiting for the last
write). In the recorded variant the time spent in the recording call itself is also measured
(most of it the wait for the update to finish computing, which the next rollout would wait for
anyway). Prints one JSON line per block, then the medians and their ratios, and (re)writes the
Tunix section of `--output` (``make bench`` runs it after `devtools.bench.checkpoint_bench`, which
rewrites the rest of that file).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint
from tunix.rl import rl_cluster as rlc

from devtools.bench import trainer_variants
from devtools.bench.checkpoint_bench import TUNIX_SECTION_START, machine
from rcpflow import recipe
from rcpflow.files.layout import CHECKPOINTS_DIR
from rcpflow.files.markdown_sections import write_section
from tpu_jobs.rcp.job_cli import run_recorder
from tpu_jobs.tunix import train
from tpu_jobs.tunix.recording import StepRecording

SECTION_START = TUNIX_SECTION_START
SAVE_MEANING = "Tunix's own async Orbax save of each step"
SECTION_END = "<!-- tunix_bench: end -->"


@dataclass(frozen=True)
class Block:
    step_s: list[float]  # rollout start to rollout start, after the warmup
    recording_s: list[float]  # time in the recording call per update (recorded variant only)


def one_block(variant: str, steps: int, warmup: int) -> Block:
    starts: list[float] = []
    recording_s: list[float] = []
    generate = rlc.RLCluster.generate
    record_update = StepRecording._record_update

    def probe(self: rlc.RLCluster, *args: Any, **kwargs: Any) -> Any:
        starts.append(time.perf_counter())
        return generate(self, *args, **kwargs)

    def timed_update(self: StepRecording, step: int) -> None:
        t0 = time.perf_counter()
        record_update(self, step)
        if step > warmup:
            recording_s.append(time.perf_counter() - t0)

    # Patched for the block only (restored below), to time what each variant adds.
    rlc.RLCluster.generate = probe  # the same probe in every variant
    StepRecording._record_update = timed_update  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory(prefix=f"tunix-bench-{variant}-") as run_dir:
            config = train.TrainConfig(run_dir=run_dir, seed=0, max_steps=steps, val_start_at=1)
            hp = config.hyperparameters()
            root = None if variant == "plain" else f"{run_dir}/{CHECKPOINTS_DIR}"
            job = train.build_job(config, hp, 1, root)
            recording = None
            if variant == "recorded":
                assert root is not None
                recorder = run_recorder(config, hp, 1)
                recorder.on_init_start()
                recording = StepRecording(
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
        StepRecording._record_update = record_update  # type: ignore[method-assign]
    return Block([b - a for a, b in itertools.pairwise(starts[warmup:])], recording_s)


def section(
    med: dict[str, float],
    per_round: list[float],
    recording_s: float,
    timed: int,
    args: argparse.Namespace,
    where: str,
) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    versions = ", ".join(
        f"{dist} {number}"
        for dist, number in (
            ("google-tunix", version("google-tunix")),
            ("jax", jax.__version__),
            ("orbax-checkpoint", orbax.checkpoint.__version__),
        )
    )
    load_end = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"""{SECTION_START}
## Tunix job (`python -m devtools.bench.tunix_bench`)

- Date: {when}; {versions}; JAX backend {jax.default_backend()}, {jax.device_count()} device(s)
- Machine: {where}; load average at the end {load_end}
- {args.rounds} rounds of three interleaved blocks (plain, checkpoints, recorded; order rotated
  per round), each a fresh RLCluster (gbs 256, seed 0) of {args.steps} updates; the first
  {args.warmup} (compilation) and the final drain left out: {timed} timed steps per variant.

| ratio | value | meaning |
| --- | --- | --- |
{trainer_variants.ratio_rows("Tunix", med, per_round, SAVE_MEANING)}
| recording call / recorded step time | {recording_s / med["recorded"]:.3f} | \
time in the loop's recording call (block on the update, timestamp, fingerprint) |

| quantity | value |
| --- | --- |
{trainer_variants.step_time_rows("Tunix", med, recording_s)}

A step is timed from one rollout's start to the next's, so the recording call (run by Tunix
right after dispatching the update, before the save) is inside it; the wait there for the new
parameters is mostly time the next rollout would wait anyway (JAX dispatches asynchronously).
The manifest rows are written by a watcher thread after Orbax commits, never by the loop.
On a shared machine the per-round ratios show how much of a difference is noise (the load
averages above: a ratio below 1 means the noise was larger than the recording's cost).
{SECTION_END}
"""


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devtools.bench.tunix_bench")
    trainer_variants.add_block_flags(ap, steps=20)
    args = ap.parse_args(argv)
    trainer_variants.check_block_flags(ap, args)
    where = machine()
    times: dict[str, list[float]] = {v: [] for v in trainer_variants.VARIANTS}
    block_medians: dict[tuple[int, str], float] = {}
    recording: list[float] = []
    for r in range(args.rounds):
        for variant in trainer_variants.round_order(r):
            block = one_block(variant, args.steps, args.warmup)
            times[variant].extend(block.step_s)
            recording.extend(block.recording_s)
            block_medians[r, variant] = statistics.median(block.step_s)
            median = round(block_medians[r, variant], 4)
            print(json.dumps({"round": r, "variant": variant, "median_step_s": median}), flush=True)
    med = {v: statistics.median(t) for v, t in times.items()}
    recording_s = statistics.median(recording)
    print(
        json.dumps(
            {
                **trainer_variants.ratios(med),
                "recording_call_s": round(recording_s, 4),
                "steps_timed_per_variant": len(times["plain"]),
                "gbs": recipe.REFERENCE_BATCH_SIZE,
            }
        ),
        flush=True,
    )
    per_round = [
        block_medians[r, "recorded"] / block_medians[r, "checkpoints"] for r in range(args.rounds)
    ]
    text = section(med, per_round, recording_s, len(times["plain"]), args, where)
    write_section(Path(args.output), text, SECTION_START, SECTION_END)
    print(f"wrote the Tunix section of {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
