"""`make bench`: checkpoint and trainer speeds as ratios measured in one run, into BENCHMARKS.md.

    python -m tpu_jobs.bench [--output BENCHMARKS.md] [--steps 30] [--restore-mb 128]

Measured here, on whatever machine runs it (all numbers are wall-clock on this machine, so only
the ratios travel):

1. toy trainer (a GRPO step of `tpu_jobs.train`'s default configuration): step time with the
   RCP hooks saving a checkpoint after every step vs no checkpointing (the async save's stall
   on the loop), and the blocking part of one save (`save()` with no earlier save in flight);
2. restore throughput of a scanned checkpoint (numpy, uncompressed) vs a raw read of the same
   files from the same disk (both from the page cache: the bench reads them once first);
3. unscan (per-layer views) time vs restore time, and vs an unscan that copies each layer;
4. the toy trainer's steps/s; the fingerprint's hash throughput (it runs inside `save()`).

Speeds are never asserted by tests; this is where they are recorded.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tpu_jobs import checkpoint as ck
from tpu_jobs import grpo
from tpu_jobs.model import param_bytes, unscan_params
from tpu_jobs.rcp_hooks import RcpHooks
from tpu_jobs.train import TrainConfig, hyperparameters_for


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    return statistics.median(timed(fn)[0] for _ in range(repeats))


@dataclass(frozen=True)
class TrainerNumbers:
    global_batch_size: int
    param_bytes: int
    step_s_off: float
    step_s_on: float
    drain_s: float
    save_blocking_s: float
    fingerprint_s: float


ROUNDS = 3


def bench_trainer(workdir: Path, steps: int) -> TrainerNumbers:
    # The trainer's default configuration (division, learning rate, policy).
    config = TrainConfig(run_dir=str(workdir / "run"), seed=0, max_steps=3 * steps + 10)
    cfg = config.model
    hp = hyperparameters_for(config)
    step_fn = grpo.make_train_step(cfg, hp)
    state = grpo.init_state(cfg, hp, seed=0)

    def one(state: grpo.TrainState, step: int) -> grpo.TrainState:
        new, _ = step_fn(state, grpo.prompts_for_step(hp, 0, step), grpo.rollout_key(0, step))
        jax.block_until_ready(new.params)
        return new

    for step in range(1, 4):  # compile and warm up
        state = one(state, step)
    step = 3

    # Interleaved blocks (off, on, off, on, ...) so that load from other processes on a shared
    # machine hits both alike. The hooks save a checkpoint after every step (val_start_at=1);
    # an "on" block ends by waiting for its last save, so no save spills into the next block.
    hooks = RcpHooks(config.run_dir, 0, hp, val_start_at=1)
    hooks.on_init_start()
    hooks.on_run_start()
    hooks_step = 0
    off_s = on_s = drain_s = 0.0
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(steps // ROUNDS):
            step += 1
            state = one(state, step)
        off_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(steps // ROUNDS):
            step += 1
            hooks_step += 1
            state = one(state, step)
            hooks.after_update(hooks_step, state.params, {"opt": state.opt_state})
        t1 = time.perf_counter()
        hooks.flush()
        drain_s += time.perf_counter() - t1
        on_s += time.perf_counter() - t0
    hooks.on_train_end()
    timed_steps = ROUNDS * (steps // ROUNDS)
    step_s_off, step_s_on = off_s / timed_steps, on_s / timed_steps
    drain_s /= ROUNDS

    # The blocking part alone: save() with no earlier save in flight.
    saver = ck.CheckpointSaver(str(workdir / "blocking"))
    blocking = []
    for i in range(1, 8):
        t, _ = timed(
            lambda i=i: saver.save(i, state.params, {"opt": state.opt_state}, timestamp_ms=i)
        )
        blocking.append(t)
        saver.wait()
    saver.close()
    return TrainerNumbers(
        global_batch_size=hp.global_batch_size,
        param_bytes=param_bytes(state.params),
        step_s_off=step_s_off,
        step_s_on=step_s_on,
        drain_s=drain_s,
        save_blocking_s=statistics.median(blocking[1:]),
        fingerprint_s=median_time(lambda: ck.weights_fingerprint(state.params), 20),
    )


@dataclass(frozen=True)
class RestoreNumbers:
    nbytes: int
    num_layers: int
    restore_s: float
    verify_s: float
    raw_read_s: float
    unscan_views_s: float
    unscan_copy_s: float


def read_all(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(16 << 20):
                total += len(chunk)
    return total


def bench_restore(workdir: Path, megabytes: int) -> RestoreNumbers:
    num_layers, d = 8, 1024
    ff = max(1, megabytes * (1 << 20) // (2 * 4 * num_layers * d))
    key = jax.random.PRNGKey(0)
    # Scanned layout, layer axis 1 (as MaxText and tpu_jobs.model): two stacked matrices.
    params = {
        "embed": {"embedding": jax.random.normal(key, (256, d))},
        "layers": {
            "mlp_in": {"kernel": jax.random.normal(key, (d, num_layers, ff))},
            "mlp_out": {"kernel": jax.random.normal(key, (ff, num_layers, d))},
        },
    }
    nbytes = param_bytes(params)
    saver = ck.CheckpointSaver(str(workdir / "restore"))
    saver.save(1, params, {"count": jnp.int32(0)}, timestamp_ms=1)
    [saved] = saver.wait()
    saver.close()
    del params
    files = [p for p in Path(saved.path, ck.PARAMS_ITEM).rglob("*") if p.is_file()]
    read_all(files)  # page cache warm for both contenders

    restores, verifies = [], []
    restored: Any = None
    for _ in range(3):
        t, (restored, _) = timed(lambda: ck.restore_params(saved.path))
        v, _ = timed(lambda tree=restored: ck.weights_fingerprint(tree))
        restores.append(t - v)  # restore_params verifies the fingerprint; count it apart
        verifies.append(v)
    raw = median_time(lambda: read_all(files), 3)
    views = median_time(lambda: unscan_params(restored, axis=1), 50)

    def unscan_copy() -> Any:
        outer, layers = unscan_params(restored, axis=1)
        return outer, [jax.tree.map(np.ascontiguousarray, layer) for layer in layers]

    copies = median_time(unscan_copy, 3)
    return RestoreNumbers(
        nbytes=nbytes,
        num_layers=num_layers,
        restore_s=statistics.median(restores),
        verify_s=statistics.median(verifies),
        raw_read_s=raw,
        unscan_views_s=views,
        unscan_copy_s=copies,
    )


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    if names:
        cpu = names[0]
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    mem = subprocess.run(["free", "-g"], capture_output=True, text=True).stdout.splitlines()
    total = mem[1].split()[1] if len(mem) > 1 else "?"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{cpu}; nproc {nproc}; {total} GiB RAM (free -g); load average at start {load}"


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def render(t: TrainerNumbers, r: RestoreNumbers, steps: int, when: str, where: str) -> str:
    mb = r.nbytes / 1e6
    ratios = ratios_of(t, r)
    return f"""# Benchmarks

Written by `make bench` (`python -m tpu_jobs.bench`); every number below comes from one run.
Only the ratios are meant to be compared across machines. No test asserts any of these.

- Date: {when}
- Machine: {where}
- Versions: Python {platform.python_version()}, jax {jax.__version__}, orbax-checkpoint \
{_version("orbax-checkpoint")}, tensorstore {_version("tensorstore")}; JAX backend \
{jax.default_backend()}

## Ratios

| ratio | value | meaning |
| --- | --- | --- |
| step time, checkpoint every step / none | {ratios["ckpt_on_off"]:.2f} | the async save's stall \
on the toy loop ({steps} steps each, in {ROUNDS} interleaved blocks) |
| save() blocking part / step time | {ratios["blocking_step"]:.2f} | what one save costs the loop \
when no earlier save is still writing |
| restore / raw read throughput | {ratios["restore_raw"]:.2f} | Orbax numpy restore vs reading the \
same files ({mb:.0f} MB, page cache) |
| unscan (views) / restore time | {ratios["unscan_restore"]:.2e} | per-layer views of \
{r.num_layers} stacked layers |
| unscan (copies) / restore time | {ratios["copy_restore"]:.2f} | for contrast: copying each \
layer out |

## Measurements

| quantity | value |
| --- | --- |
| toy trainer steps/s (gbs {t.global_batch_size}, no checkpointing) | {1 / t.step_s_off:.1f} |
| toy step time, no checkpointing | {t.step_s_off * 1e3:.1f} ms |
| toy step time, RCP hooks + checkpoint every step | {t.step_s_on * 1e3:.1f} ms |
| save() blocking part (no save in flight) | {t.save_blocking_s * 1e3:.1f} ms |
| waiting for the last save of a block (included above) | {t.drain_s * 1e3:.1f} ms |
| toy policy parameters | {t.param_bytes / 1e6:.2f} MB |
| weights fingerprint (sha256) of the toy policy | {t.fingerprint_s * 1e3:.2f} ms |
| restore throughput (numpy, uncompressed, {mb:.0f} MB) | {gbps(r.nbytes, r.restore_s):.2f} GB/s |
| raw read throughput, same files | {gbps(r.nbytes, r.raw_read_s):.2f} GB/s |
| fingerprint verify after restore | {gbps(r.nbytes, r.verify_s):.2f} GB/s |
| restore time | {r.restore_s * 1e3:.1f} ms |
| unscan to views | {r.unscan_views_s * 1e3:.3f} ms |
| unscan with per-layer copies | {r.unscan_copy_s * 1e3:.1f} ms |

## Reading these numbers

- Orbax keeps one save in flight: `save()` first waits for the previous save to commit. When a
  save (here dominated by Orbax's fixed per-save work, not bytes) takes longer than a training
  step, the loop waits for it, which is what the first ratio shows on the toy model; when the
  step is longer than the save (any real model), the stall is the blocking part alone.
- The timestamp of a step is taken before its save starts, so save time never enters the
  step's own timestamp; a stall delays later steps (it is real time-to-train).
"""


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def ratios_of(t: TrainerNumbers, r: RestoreNumbers) -> dict[str, float]:
    return {
        "ckpt_on_off": t.step_s_on / t.step_s_off,
        "blocking_step": t.save_blocking_s / t.step_s_off,
        "restore_raw": (r.nbytes / r.restore_s) / (r.nbytes / r.raw_read_s),
        "unscan_restore": r.unscan_views_s / r.restore_s,
        "copy_restore": r.unscan_copy_s / r.restore_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tpu_jobs.bench", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--output", default="BENCHMARKS.md", help="markdown file to (re)write")
    ap.add_argument("--steps", type=int, default=30, help="toy steps timed per configuration")
    ap.add_argument("--restore-mb", type=int, default=128, help="size of the restore checkpoint")
    args = ap.parse_args(argv)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    where = machine()
    workdir = Path(tempfile.mkdtemp(prefix="rcpflow-bench-"))
    try:
        print(
            f"bench: toy trainer, {args.steps} steps without and with checkpoints ...", flush=True
        )
        trainer = bench_trainer(workdir, args.steps)
        print(f"bench: restore of a {args.restore_mb} MB scanned checkpoint ...", flush=True)
        restore = bench_restore(workdir, args.restore_mb)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    Path(args.output).write_text(render(trainer, restore, args.steps, when, where))
    for name, value in ratios_of(trainer, restore).items():
        print(f"{name:16s} {value:.3g}")
    print(f"{'steps_per_s':16s} {1 / trainer.step_s_off:.3g}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
