"""`make bench`: checkpoint and trainer speeds as ratios measured in one run, into BENCHMARKS.md.

    python -m devtools.bench.checkpoint_bench [--output BENCHMARKS.md] [--steps 30]
        [--restore-mb 128]

Measured here, on whatever machine runs it (all numbers are wall-clock on this machine, so only
the ratios travel):

1. toy trainer (a GRPO step of `tpu_jobs.train`'s default configuration): step time with the
   RCP hooks saving a checkpoint after every step vs no checkpointing, in the loop (what the
   steps' timestamps see) and including the wait for the queued saves at the end of a block;
   the same with a queue of one (`max_pending_saves=1`: each save waits for the previous one);
   the part of one save the loop runs itself (`save()`: fingerprint started, step queued) and
   one save's write in the background, each against a step;
2. restore throughput of a scanned checkpoint (numpy, uncompressed) vs a raw read of the same
   files from the same disk (both from the page cache: the bench reads them once first);
3. unscan (per-layer views) time vs restore time, and vs an unscan that copies each layer;
4. the toy trainer's steps/s; the fingerprint's throughput;
5. recording cost by model size: the toy trainer itself (`tpu_jobs.launch`, 1 and 2
   processes) at about 1M to 100M parameters, checkpointing every step: the loop's time in
   recording (the wait for every process, timestamp, queueing the save, stop decision; the step
   lines' ``recording_s``) over the step's own compute (``step_s``), the bytes of one step's
   checkpoint, and the step time against a run that saves nothing.

Speeds are never asserted by tests; this is where they are recorded.
"""

from __future__ import annotations

import argparse
import datetime
import json
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
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rcpflow.files.markdown_sections import write_head, write_section
from tpu_jobs.rcp.callbacks import RcpHooks
from tpu_jobs.rcp.checkpoint_format import PARAMS_ITEM
from tpu_jobs.rcp.checkpoint_restore import restore_params
from tpu_jobs.rcp.checkpoint_writer import DEFAULT_MAX_PENDING, CheckpointSaver
from tpu_jobs.rcp.fingerprint import weights_fingerprint
from tpu_jobs.toy import grpo
from tpu_jobs.toy.model import param_bytes, unscan_params
from tpu_jobs.toy.train import TrainConfig

TUNIX_SECTION_START = "<!-- tunix_bench: start -->"  # devtools.bench.tunix_bench's


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
    max_pending: int
    block_steps: int
    step_s_off: float
    step_s_on: float  # in the loop: step + after_update
    drain_s: float  # per block: waiting for the queued saves after its last step
    step_s_on_one: float  # the same with max_pending_saves=1
    drain_s_one: float
    save_blocking_s: float
    save_write_s: float
    fingerprint_s: float


@dataclass(frozen=True)
class LoopTimes:
    loop_s: float = 0.0
    drain_s: float = 0.0


ROUNDS = 3


def bench_trainer(workdir: Path, steps: int) -> TrainerNumbers:
    # The trainer's default configuration (division, learning rate, policy).
    config = TrainConfig(run_dir=str(workdir / "run"), seed=0, max_steps=3 * steps + 10)
    cfg = config.model
    hp = config.hyperparameters()
    step_fn = grpo.make_train_step(cfg, hp)
    state = grpo.init_state(cfg, hp, seed=0)

    def one(state: grpo.TrainState, step: int) -> grpo.TrainState:
        new, _ = step_fn(state, grpo.prompts_for_step(hp, 0, step), grpo.rollout_key(0, step))
        jax.block_until_ready(new.params)
        return new

    for step in range(1, 4):  # compile and warm up
        state = one(state, step)
    step = 3

    # Interleaved blocks (off, on, on-with-a-queue-of-one, off, ...) so that load from other
    # processes on a shared machine hits all alike. The hooks save a checkpoint after every step
    # (val_start_at=1); an "on" block ends by waiting for its queued saves (timed apart), so no
    # save spills into the next block.
    hooks = {
        depth: RcpHooks(
            str(workdir / f"run{depth}"), 0, hp, val_start_at=1, max_pending_saves=depth
        )
        for depth in (DEFAULT_MAX_PENDING, 1)
    }
    times = {depth: LoopTimes() for depth in hooks}
    for h in hooks.values():
        h.on_init_start()
        h.on_run_start()
    hooks_step = 0
    off_s = 0.0
    per_block = steps // ROUNDS
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(per_block):
            step += 1
            state = one(state, step)
        off_s += time.perf_counter() - t0
        for depth, h in hooks.items():
            t0 = time.perf_counter()
            for i in range(per_block):
                step += 1
                state = one(state, step)
                h.after_update(hooks_step + i + 1, state.params, {"opt": state.opt_state})
            t1 = time.perf_counter()
            h.flush()
            t2 = time.perf_counter()
            times[depth] = LoopTimes(times[depth].loop_s + t1 - t0, times[depth].drain_s + t2 - t1)
        hooks_step += per_block
    for h in hooks.values():
        h.on_train_end()
    timed_steps = ROUNDS * per_block
    main, one_deep = times[DEFAULT_MAX_PENDING], times[1]

    # What one save costs with nothing else running: the loop's part (`save()`: the fingerprint
    # started and the step queued) and the write in the saver's thread (to its commit).
    saver = CheckpointSaver(str(workdir / "blocking"))
    blocking, writes = [], []
    for i in range(1, 8):
        t0 = time.perf_counter()
        saver.save(i, state.params, {"opt": state.opt_state}, timestamp_ms=i)
        t1 = time.perf_counter()
        saver.wait()
        blocking.append(t1 - t0)
        writes.append(time.perf_counter() - t1)
    saver.close()
    return TrainerNumbers(
        global_batch_size=hp.global_batch_size,
        param_bytes=param_bytes(state.params),
        max_pending=DEFAULT_MAX_PENDING,
        block_steps=per_block,
        step_s_off=off_s / timed_steps,
        step_s_on=main.loop_s / timed_steps,
        drain_s=main.drain_s / ROUNDS,
        step_s_on_one=one_deep.loop_s / timed_steps,
        drain_s_one=one_deep.drain_s / ROUNDS,
        save_blocking_s=statistics.median(blocking[1:]),
        save_write_s=statistics.median(writes[1:]),
        fingerprint_s=median_time(lambda: weights_fingerprint(state.params), 20),
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
    # Scanned layout, layer axis 1 (as MaxText and tpu_jobs.toy.model): two stacked matrices.
    params = {
        "embed": {"embedding": jax.random.normal(key, (256, d))},
        "layers": {
            "mlp_in": {"kernel": jax.random.normal(key, (d, num_layers, ff))},
            "mlp_out": {"kernel": jax.random.normal(key, (ff, num_layers, d))},
        },
    }
    nbytes = param_bytes(params)
    saver = CheckpointSaver(str(workdir / "restore"))
    saver.save(1, params, {"count": jnp.int32(0)}, timestamp_ms=1)
    [saved] = saver.wait()
    saver.close()
    del params
    files = [p for p in Path(saved.path, PARAMS_ITEM).rglob("*") if p.is_file()]
    read_all(files)  # page cache warm for both contenders

    restores, verifies = [], []
    restored: Any = None
    for _ in range(3):
        t, (restored, _) = timed(partial(restore_params, saved.path))
        v, _ = timed(partial(weights_fingerprint, restored))
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


SIZES_TITLE = "## Recording cost by model size"
# (d_model, d_ff, num_layers): about 1.6M, 9.5M and 101M parameters (vocab 16).
SIZES = ((256, 1024, 2), (512, 2048, 3), (1024, 4096, 8))
SIZE_STEPS = 8
SIZES_HEADER = (
    "| params | processes | full state every | step time | recording / step "
    "| waiting for the saver / step | checkpoint bytes per step | step time / without saves |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- |"
)
SIZES_FULL_STATE_EVERY = (1, 10)
RECORDING_GOAL = 0.02  # issue 17: the loop's part of recording, over the step


@dataclass(frozen=True)
class SizeRow:
    params: int
    processes: int
    full_state_every: int
    step_s: float
    recording_s: float
    save_wait_s: float  # of recording_s: the save queue full (saves outlasting steps)
    checkpoint_bytes: int  # the mean of the timed steps' folders
    plain_step_s: float  # the same configuration's steps before any save


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _toy_run(run_dir: Path, size: tuple[int, int, int], processes: int, *flags: str) -> list[dict]:
    """Process 0's step lines of one toy run through the launcher (1 device per process)."""
    d_model, d_ff, layers = size
    command = [
        sys.executable, "-m", "tpu_jobs.launch", "--processes", str(processes), "--",
        sys.executable, "-m", "tpu_jobs.train", "--run-dir", str(run_dir), "--seed", "0",
        "--global-batch-size", "32", "--max-steps", str(SIZE_STEPS),
        "--d-model", str(d_model), "--d-ff", str(d_ff), "--num-layers", str(layers), *flags,
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"bench run {size} x {processes} failed:\n{proc.stderr[-3000:]}")
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    return [r for r in lines if "step_s" in r and r.get("process", 0) == 0]


def bench_size(workdir: Path, size: tuple[int, int, int], processes: int) -> list[SizeRow]:
    """Toy runs saving every step (a full state every K for each K), and one that saves
    nothing until its last step (the baseline step time)."""
    run_dir = workdir / f"size-{size[0]}-{processes}"
    plain = _toy_run(run_dir, size, processes, "--val-start-at", str(SIZE_STEPS))[2:-1]
    shutil.rmtree(run_dir, ignore_errors=True)
    rows = []
    for every in SIZES_FULL_STATE_EVERY:
        flags = ("--val-start-at", "1", "--full-state-every", str(every))
        steps = _toy_run(run_dir, size, processes, *flags)[2:]  # steps 1-2 compile
        folders = [run_dir / "checkpoints" / str(r["step"]) for r in steps]
        params, _ = restore_params(str(folders[-1]))
        rows.append(
            SizeRow(
                params=sum(int(np.asarray(x).size) for x in jax.tree.leaves(params)),
                processes=processes,
                full_state_every=every,
                step_s=statistics.median(r["step_s"] for r in steps),
                recording_s=statistics.median(r["recording_s"] for r in steps),
                save_wait_s=statistics.median(r["save_wait_s"] for r in steps),
                checkpoint_bytes=sum(_tree_bytes(f) for f in folders) // len(folders),
                plain_step_s=statistics.median(r["step_s"] for r in plain),
            )
        )
        shutil.rmtree(run_dir, ignore_errors=True)
    return rows


def render_sizes(rows: list[SizeRow], when: str, where: str) -> str:
    table = "\n".join(
        f"| {r.params / 1e6:.1f}M | {r.processes} | {r.full_state_every} | {r.step_s:.3f} s | "
        f"{r.recording_s / r.step_s:.3f} | {r.save_wait_s / r.step_s:.3f} | "
        f"{r.checkpoint_bytes / 1e6:.0f} MB | {r.step_s / r.plain_step_s:.2f} |"
        for r in rows
    )
    met = [r for r in rows if r.recording_s / r.step_s <= RECORDING_GOAL]
    own = [r for r in rows if (r.recording_s - r.save_wait_s) / r.step_s <= RECORDING_GOAL]
    return f"""{SIZES_TITLE}

Written by `python -m devtools.bench.checkpoint_bench` (`--only-sizes` rewrites just this section);
{when}; {where}. The toy trainer through `tpu_jobs.launch` (1 CPU device per process), gbs 32,
a checkpoint every step (its weights; the full train state every K-th, `--full-state-every
K`), {SIZE_STEPS} steps, medians of steps 3-{SIZE_STEPS} of process 0 (steps 1-2 compile).
`step time`: the update's own compute on this process; `recording / step`: the loop's time
after it (the wait for every process's update, timestamp, starting the fingerprint, queueing
the save, and the stop decision) over the step time; `waiting for the saver / step`: the part
of it spent waiting for room in the save queue ({DEFAULT_MAX_PENDING} steps), i.e. saves
outlasting steps; `checkpoint bytes per step`: the mean of those steps' folders; `step time /
without saves`: the step time over that of a run whose steps 3-{SIZE_STEPS - 1} save nothing:
what the saver's thread, Orbax's writes and the fingerprint, running beside the next steps on
the same CPU cores, cost the computation.

{SIZES_HEADER}
{table}

Goal (issue 17): `recording / step` at most {RECORDING_GOAL}: met by {len(met)} of {len(rows)}
rows; without the waits for the saver (the loop's own part), by {len(own)} of {len(rows)}.
"""


SIZES_START, SIZES_END = "<!-- bench-sizes:start -->", "<!-- bench-sizes:end -->"


def write_sizes_section(output: Path, section: str) -> None:
    """Put `section` into `output` between its markers, replacing an earlier one; a new one goes
    before the Tunix section's markers (which `devtools.bench.tunix_bench` rewrites whole)."""
    write_section(output, section, SIZES_START, SIZES_END, new_before=TUNIX_SECTION_START)


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
    blocks = f"{ROUNDS} interleaved blocks of {t.block_steps} steps each"
    return f"""# Benchmarks

Written by `make bench`: `python -m devtools.bench.checkpoint_bench`, then the Tunix job's
section at the end by `python -m devtools.bench.tunix_bench`; the numbers of each section come
from one run.
Only the ratios are meant to be compared across machines. No test asserts any of these.

- Date: {when}
- Machine: {where}
- Versions: Python {platform.python_version()}, jax {jax.__version__}, orbax-checkpoint \
{_version("orbax-checkpoint")}, tensorstore {_version("tensorstore")}; JAX backend \
{jax.default_backend()}

## Ratios

| ratio | value | meaning |
| --- | --- | --- |
| step time, checkpoint every step / none | {ratios["ckpt_on_off"]:.2f} | in the loop (step + \
`after_update`), what the steps' timestamps see; queue of {t.max_pending} (the default); {blocks} |
| the same, with each block's wait for its queued saves | {ratios["ckpt_on_off_drained"]:.2f} | \
the saves' total cost to the machine |
| step time, queue of one / none | {ratios["ckpt_on_off_one"]:.2f} | `max_pending_saves=1`: \
each save waits for the previous one, as Orbax's own async save does |
| the same, with each block's wait for its queued saves | \
{ratios["ckpt_on_off_one_drained"]:.2f} | |
| save() in the loop / step time | {ratios["blocking_step"]:.3f} | the loop's own part of a \
save: fingerprint started, step queued |
| one save's write / step time | {ratios["write_step"]:.2f} | in the saver's thread, nothing else \
running; above 1, saves fall behind steps and the queue fills |
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
| toy step time in the loop, RCP hooks + checkpoint every step (queue of {t.max_pending}) | \
{t.step_s_on * 1e3:.1f} ms |
| waiting for the queued saves after a block's last step (queue of {t.max_pending}) | \
{t.drain_s * 1e3:.1f} ms |
| toy step time in the loop, queue of one | {t.step_s_on_one * 1e3:.1f} ms |
| waiting for the queued save after a block's last step (queue of one) | \
{t.drain_s_one * 1e3:.1f} ms |
| save() in the loop: fingerprint started, step queued | {t.save_blocking_s * 1e3:.2f} ms |
| one save's write to its commit (saver's thread, nothing else running) | \
{t.save_write_s * 1e3:.1f} ms |
| toy policy parameters | {t.param_bytes / 1e6:.2f} MB |
| weights fingerprint (pos32, on device) of the toy policy | {t.fingerprint_s * 1e3:.2f} ms |
| restore throughput (numpy, uncompressed, {mb:.0f} MB) | {gbps(r.nbytes, r.restore_s):.2f} GB/s |
| raw read throughput, same files | {gbps(r.nbytes, r.raw_read_s):.2f} GB/s |
| fingerprint verify after restore | {gbps(r.nbytes, r.verify_s):.2f} GB/s |
| restore time | {r.restore_s * 1e3:.1f} ms |
| unscan to views | {r.unscan_views_s * 1e3:.3f} ms |
| unscan with per-layer copies | {r.unscan_copy_s * 1e3:.1f} ms |

## Reading these numbers

- Since issue 17 every process takes part in an async Orbax save of its own shards:
  `after_update` computes the weights fingerprint on device (the wait for the update on every
  process), then Orbax copies the arrays to host memory and returns; the write and commit run
  in Orbax's thread, and process 0's watcher writes each row after the commit. Orbax keeps one
  save in flight: a `save()` first waits for the previous one, so `max_pending_saves` above 1
  only lets the rows lag; the "queue of one" rows measure the same design.
- The design before it (host snapshots written by our own thread, synchronous Orbax saves;
  its numbers are in this file's history) could not save arrays split over several hosts.
  On 2 shared CPU cores the fixed CPU cost of an Orbax save (~100 ms, mostly
  its Python, threads and event loops) is comparable to a toy step, which is why the small
  sizes pay most; the table by model size shows the ratio where steps are longer.
- A step's timestamp is taken before its save, so save time never enters the step's own
  timestamp; slowdowns of later steps are real time-to-train. The wait at the end of a block
  stands for the saves still unfinished when training stops, after the last step's timestamp.
"""


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def ratios_of(t: TrainerNumbers, r: RestoreNumbers) -> dict[str, float]:
    off_block = t.block_steps * t.step_s_off
    return {
        "ckpt_on_off": t.step_s_on / t.step_s_off,
        "ckpt_on_off_drained": (t.block_steps * t.step_s_on + t.drain_s) / off_block,
        "ckpt_on_off_one": t.step_s_on_one / t.step_s_off,
        "ckpt_on_off_one_drained": (t.block_steps * t.step_s_on_one + t.drain_s_one) / off_block,
        "blocking_step": t.save_blocking_s / t.step_s_off,
        "write_step": t.save_write_s / t.step_s_off,
        "restore_raw": (r.nbytes / r.restore_s) / (r.nbytes / r.raw_read_s),
        "unscan_restore": r.unscan_views_s / r.restore_s,
        "copy_restore": r.unscan_copy_s / r.restore_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m devtools.bench.checkpoint_bench", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--output", default="BENCHMARKS.md", help="markdown file to (re)write")
    ap.add_argument("--steps", type=int, default=30, help="toy steps timed per configuration")
    ap.add_argument("--restore-mb", type=int, default=128, help="size of the restore checkpoint")
    ap.add_argument(
        "--only-sizes", action="store_true", help="only the recording cost by model size"
    )
    args = ap.parse_args(argv)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    where = machine()
    workdir = Path(tempfile.mkdtemp(prefix="rcpflow-bench-"))
    if args.only_sizes:
        try:
            rows = []
            for size in SIZES:
                for processes in (1, 2):
                    print(f"bench: toy {size} on {processes} process(es) ...", flush=True)
                    rows.extend(bench_size(workdir, size, processes))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        write_sizes_section(Path(args.output), render_sizes(rows, when, where))
        print(f"wrote {args.output}")
        return 0
    try:
        print(
            f"bench: toy trainer, {args.steps} steps without and with checkpoints ...", flush=True
        )
        trainer = bench_trainer(workdir, args.steps)
        print(f"bench: restore of a {args.restore_mb} MB scanned checkpoint ...", flush=True)
        restore = bench_restore(workdir, args.restore_mb)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    write_head(args.output, render(trainer, restore, args.steps, when, where))
    sizes = []
    for size in SIZES:
        for processes in (1, 2):
            print(f"bench: toy {size} on {processes} process(es) ...", flush=True)
            sizes.extend(bench_size(workdir, size, processes))
    shutil.rmtree(workdir, ignore_errors=True)
    write_sizes_section(Path(args.output), render_sizes(sizes, when, where))
    for name, value in ratios_of(trainer, restore).items():
        print(f"{name:16s} {value:.3g}")
    print(f"{'steps_per_s':16s} {1 / trainer.step_s_off:.3g}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
