"""Bench of the MaxText job: what rcpflow's recording adds to MaxText's step with its native
scanned checkpoint every step, and MaxText's scanned -> unscanned conversion against rcpflow's
own zero-copy unscan (per-layer views) of the same checkpoint.

    python -m devtools.bench.maxtext_bench [--rounds 4] [--steps 24] [--warmup 3]
        [--conversions 3] [--output BENCHMARKS.md]

MaxText runs in its own environment (Python 3.13 in a Debian 13 root,
`devtools.servers.maxtext_env`, built first if missing: needs root). This module is run twice:
from the project's venv it builds the environment, runs itself inside it (``--in-env``: the
measurements, one JSON line per block and one result line) and (re)writes the MaxText section of
`--output` from that one run's numbers (``make bench`` runs it after the other benches).

Three variants of the same training (the job's digit task and default model, gbs 256, seed 0,
open division's rate), each a fresh MaxText trainer (`tpu_jobs.maxtext.model.build_trainer`:
MaxText's setup and compiled train step) of ``--steps`` updates in a fresh folder, run in
interleaved blocks (round r runs all three, in an order rotated per round):

    plain        MaxText's train step, no checkpoints (the loss read back each step, as
                 MaxText's own loop logs it)
    checkpoints  the same plus MaxText's own async save of every step
                 (``checkpointing.save_checkpoint``: the full train state, scanned), no recording
    recorded     the job itself (`tpu_jobs.maxtext.train.train`, validation from step 1): the
                 block on the new parameters, the timestamp, both fingerprints, MaxText's save
                 with the record in its metadata, the commit watcher and its manifest rows, the
                 MLLOG, the stop-request check

A step's time is from one call of MaxText's train step to the next (the same probe on
`Trainer.step` in every variant); the first ``--warmup`` steps and the end's drain are left out.

Then, on one committed checkpoint of the last recorded block, ``--conversions`` times each:
MaxText's ``generate_param_only_checkpoint`` (`model.convert`: read the full state, unroll,
cast to bf16, write a parameters-only checkpoint) and its ``from_pretrained(scan_layers=false)``
restore of the result (`model.restore`), as the evaluator runs them; against Orbax's read of the
scanned parameters (`tpu_jobs.maxtext.checkpoints.read_scanned_params`) and rcpflow's unscan of
them into per-layer views (`tpu_jobs.toy.model.unscan_params`, no weight copied).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from devtools.bench import trainer_variants
from devtools.servers import maxtext_env
from rcpflow.files.markdown_sections import write_section

SAVE_MEANING = "MaxText's own async save of the full train state (scanned) each step"
SECTION_START = "<!-- maxtext_bench: start -->"
SECTION_END = "<!-- maxtext_bench: end -->"
NEW_BEFORE = "<!-- verdict-bench:start -->"  # after the Tunix job's section
SEED, GBS = 0, 256
LINE = "maxtext_bench "  # the prefix of the in-env part's JSON lines (MaxText logs a lot too)
VIEW_REPEATS = 50
REPO = Path(__file__).resolve().parents[2]


def emit(obj: dict[str, Any]) -> None:
    print(LINE + json.dumps(obj), flush=True)


# ---- inside MaxText's environment (Python 3.13, MaxText 0.2.5) ---------------------------------


def _median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _block(variant: str, steps: int, warmup: int, run_dir: str) -> dict[str, Any]:
    """One block: `steps` updates of `variant` in `run_dir`; its step times after the warmup."""
    from tpu_jobs.maxtext import config, model, train
    from tpu_jobs.maxtext.checkpoints import CheckpointRecord

    starts: list[float] = []
    printed: list[dict[str, object]] = []
    step_fn, say = model.Trainer.step, train.say

    saves: list[float] = []
    save_fn = model.Trainer.save

    def probe(self: model.Trainer, batch: model.Batch) -> Any:
        starts.append(time.perf_counter())
        return step_fn(self, batch)

    def timed_save(self: model.Trainer, record: CheckpointRecord) -> None:
        started = time.perf_counter()
        save_fn(self, record)
        saves.append(time.perf_counter() - started)

    cfg = train.TrainConfig(
        run_dir=run_dir,
        seed=SEED,
        global_batch_size=GBS,
        max_steps=steps,
        val_start_at=1,
        division="open",
    )
    hp = cfg.hyperparameters()
    model.Trainer.step = probe  # type: ignore[method-assign]
    model.Trainer.save = timed_save  # type: ignore[method-assign]

    def keep(record: dict[str, object]) -> None:  # the job's lines, kept instead of printed
        printed.append(record)

    train.say = keep
    try:
        if variant == "recorded":
            train.train(cfg)
        else:
            trainer = model.build_trainer(config.train_overrides(cfg.model, hp, SEED, run_dir))
            from maxtext.common import checkpointing  # type: ignore[import-not-found]

            for step in range(1, steps + 1):
                metrics = trainer.step(model.train_batch(SEED, step, GBS))
                float(metrics["learning/loss"])  # the update has run (MaxText's loop logs it)
                if variant == "checkpoints":
                    started = time.perf_counter()
                    saved = checkpointing.save_checkpoint(
                        trainer.checkpointer, step, trainer.state, trainer.config
                    )
                    saves.append(time.perf_counter() - started)
                    assert saved, f"MaxText declined to save step {step}"
            trainer.close()
    finally:
        model.Trainer.step = step_fn  # type: ignore[method-assign]
        model.Trainer.save = save_fn  # type: ignore[method-assign]
        train.say = say
    assert len(starts) == steps, (variant, len(starts))
    timed = [b - a for a, b in zip(starts[warmup:], starts[warmup + 1 :], strict=False)]
    recording = [float(str(p["recording_s"])) for p in printed if "recording_s" in p]
    if variant == "recorded":  # one save per update (validation from step 1)
        assert len(recording) == len(saves) == steps, (len(recording), len(saves))
    own = [r - s for r, s in zip(recording, saves, strict=False)]  # the recording less the save
    return {
        "step_s": timed,
        "recording_s": recording[warmup:],
        "save_s": saves[warmup:],
        "own_s": own[warmup:],
    }


def _conversion(step_folder: str, repeats: int) -> dict[str, Any]:
    """MaxText's conversion and restore vs the scanned read and rcpflow's views, `repeats`
    times each, on the committed checkpoint `step_folder`."""
    import numpy as np

    from tpu_jobs.maxtext import model
    from tpu_jobs.maxtext.checkpoints import read_record, read_scanned_params
    from tpu_jobs.maxtext.config import PARAM_SCAN_AXIS, ModelConfig
    from tpu_jobs.toy.model import param_bytes, unscan_params

    size = ModelConfig.from_json(read_record(step_folder).model, where=step_folder)
    convert_s, restore_s, read_s = [], [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="maxtext-bench-unscanned-") as work:
            started = time.perf_counter()
            items = model.convert(size, step_folder, f"{work}/unscanned")
            converted = time.perf_counter()
            restored = model.restore(size, items, work).params()
            restore_s.append(time.perf_counter() - converted)
            convert_s.append(converted - started)
            unscanned_bytes = sum(f.stat().st_size for f in Path(items).rglob("*") if f.is_file())
        started = time.perf_counter()
        scanned = read_scanned_params(step_folder)
        read_s.append(time.perf_counter() - started)
    decoder = scanned["decoder"]
    outer, layers = unscan_params(decoder, axis=PARAM_SCAN_AXIS)
    stacked = decoder["layers"]["mlp"]["wi_0"]["kernel"]
    assert len(layers) == size.num_layers
    assert all(np.shares_memory(layer["mlp"]["wi_0"]["kernel"], stacked) for layer in layers)
    assert set(outer) | {"layers"} == set(decoder)
    views_s = _median_time(lambda: unscan_params(decoder, axis=PARAM_SCAN_AXIS), VIEW_REPEATS)
    checkpoint_bytes = sum(f.stat().st_size for f in Path(step_folder).rglob("*") if f.is_file())
    return {
        "convert_s": convert_s,
        "restore_s": restore_s,
        "read_scanned_s": read_s,
        "views_s": views_s,
        "param_bytes": param_bytes(scanned),
        "restored_bytes": param_bytes(restored),
        "checkpoint_bytes": checkpoint_bytes,
        "unscanned_bytes": unscanned_bytes,
        "num_layers": size.num_layers,
        "model": size.to_json(),
    }


def measure(args: argparse.Namespace) -> int:
    """The in-env part: the blocks, then the conversion; JSON lines on stdout."""
    from importlib.metadata import version

    import jax

    from tpu_jobs.maxtext.checkpoints import complete_steps
    from tpu_jobs.maxtext.config import ModelConfig

    times: dict[str, list[float]] = {v: [] for v in trainer_variants.VARIANTS}
    recording: list[float] = []
    saves: dict[str, list[float]] = {"checkpoints": [], "recorded": []}
    own: list[float] = []
    per_round: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="maxtext-bench-") as work:
        last_recorded = ""
        for r in range(args.rounds):
            medians = {}
            for variant in trainer_variants.round_order(r):
                run_dir = f"{work}/{r}-{variant}"
                block = _block(variant, args.steps, args.warmup, run_dir)
                times[variant].extend(block["step_s"])
                recording.extend(block["recording_s"])
                own.extend(block["own_s"])
                if variant in saves:
                    saves[variant].extend(block["save_s"])
                medians[variant] = statistics.median(block["step_s"])
                emit({"round": r, "variant": variant, "median_step_s": round(medians[variant], 4)})
                if variant == "recorded":
                    last_recorded = run_dir
            per_round.append(medians)
        checkpoints_dir = f"{last_recorded}/checkpoints"
        step = complete_steps(checkpoints_dir)[-1]
        conversion = _conversion(f"{checkpoints_dir}/{step}", args.conversions)
        emit({"conversion": {k: v for k, v in conversion.items() if k != "model"}})
    emit(
        {
            "result": {
                "step_s": times,
                "recording_s": recording,
                "save_s": saves,
                "own_s": own,
                "per_round": per_round,
                "conversion": {**conversion, "step": step},
                "versions": {d: version(d) for d in ("maxtext", "jax", "orbax-checkpoint", "flax")},
                "python": sys.version.split()[0],
                "backend": jax.default_backend(),
                "devices": jax.device_count(),
                "model": ModelConfig().to_json(),
            }
        }
    )
    return 0


# ---- from the project's venv: the environment, the run, the section ----------------------------


def run_in_env(args: argparse.Namespace) -> dict[str, Any]:
    """This module inside MaxText's environment with the same settings; its result."""
    missing = maxtext_env.missing_tools()
    if missing:
        raise SystemExit(
            f"maxtext_bench: MaxText's environment cannot be built or entered here: missing "
            f"{', '.join(missing)} (devtools/servers/maxtext_env.py needs root and debootstrap)"
        )
    maxtext_env.ensure_env()
    flags = [
        f"--rounds={args.rounds}",
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
        f"--conversions={args.conversions}",
    ]
    argv = maxtext_env.python_argv(
        ["-m", "devtools.bench.maxtext_bench", "--in-env", *flags], cwd=str(REPO)
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result: dict[str, Any] | None = None
    tail: list[str] = []
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = [*tail[-40:], line]
            if not line.startswith(LINE):
                continue
            obj = json.loads(line[len(LINE) :])
            if "result" in obj:
                result = obj["result"]
            else:
                print(json.dumps(obj), flush=True)
    if proc.returncode != 0 or result is None:
        raise SystemExit(
            f"maxtext_bench: the in-env run failed ({proc.returncode}):\n" + "".join(tail)
        )
    return result


def section(res: dict[str, Any], args: argparse.Namespace, where: str) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    med = {v: statistics.median(res["step_s"][v]) for v in trainer_variants.VARIANTS}
    recording_s = statistics.median(res["recording_s"])
    own_s = statistics.median(res["own_s"])
    save_ckpt_s = statistics.median(res["save_s"]["checkpoints"])
    save_rec_s = statistics.median(res["save_s"]["recorded"])
    per_round = [m["recorded"] / m["checkpoints"] for m in res["per_round"]]
    conv = res["conversion"]
    convert_s, restore_s = (
        statistics.median(conv["convert_s"]),
        statistics.median(conv["restore_s"]),
    )
    read_s, views_s = statistics.median(conv["read_scanned_s"]), conv["views_s"]
    versions = ", ".join(f"{d} {v}" for d, v in res["versions"].items())
    model = ", ".join(f"{k} {v}" for k, v in res["model"].items())
    timed = len(res["step_s"]["plain"])
    load_end = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    spread = ", ".join(f"{x:.2f}" for x in conv["convert_s"])
    return f"""{SECTION_START}
## MaxText job (`python -m devtools.bench.maxtext_bench`)

- Date: {when}; {versions}; Python {res["python"]} in MaxText's environment
  (`devtools/servers/maxtext_env.py`); JAX backend {res["backend"]}, {res["devices"]} device(s)
- Machine: {where}; load average at the end {load_end}
- Model: the job's default ({model}), gbs {GBS}, seed {SEED}, the digit task.
- {args.rounds} rounds of three interleaved blocks (plain, checkpoints, recorded; order rotated
  per round), each a fresh MaxText trainer (setup and compile before the first step) of
  {args.steps} updates; the first {args.warmup} and the final drain left out: {timed} timed steps
  per variant.

| ratio | value | meaning |
| --- | --- | --- |
{trainer_variants.ratio_rows("MaxText", med, per_round, SAVE_MEANING)}
| recording call / recorded step time | {recording_s / med["recorded"]:.3f} | time in the job's \
recording (timestamp, both fingerprints, MaxText's save call) |
| recording call less the save / recorded step time | {own_s / med["recorded"]:.3f} | rcpflow's \
own part of it (timestamp, the two fingerprints, the record, the commit watch's hand-off) |
| MaxText conversion / rcpflow views | {convert_s / views_s:.3g} | \
`generate_param_only_checkpoint` vs per-layer views of the same scanned parameters in memory |
| MaxText conversion + restore / scanned read + views | \
{(convert_s + restore_s) / (read_s + views_s):.1f} | the evaluator's way to unscanned weights in \
memory vs rcpflow's, both from the same committed checkpoint |

| quantity | value |
| --- | --- |
{trainer_variants.step_time_rows("MaxText", med, recording_s)}
| of which rcpflow's own (the call less MaxText's save), median | {own_s * 1e3:.1f} ms |
| median time in MaxText's save call, checkpoints / recorded | {save_ckpt_s * 1e3:.1f} ms / \
{save_rec_s * 1e3:.1f} ms |
| the checkpoint converted (step {conv["step"]}: full train state, {conv["num_layers"]} layers \
scanned) | {conv["checkpoint_bytes"] / 1e6:.2f} MB on disk, {conv["param_bytes"] / 1e6:.2f} MB \
of float32 parameters |
| MaxText's conversion (`generate_param_only_checkpoint`), median of {len(conv["convert_s"])} \
| {convert_s:.2f} s (each: {spread}); writes {conv["unscanned_bytes"] / 1e6:.2f} MB, bf16 |
| MaxText's restore of it (`from_pretrained`, `scan_layers=false`) | {restore_s:.2f} s |
| Orbax read of the scanned parameters (float32, no optimizer state) | {read_s * 1e3:.1f} ms |
| rcpflow's unscan to per-layer views (`unscan_params`), median of {VIEW_REPEATS} \
| {views_s * 1e6:.1f} µs |

A step is timed from one call of MaxText's train step to the next, so the job's recording (after
the block on the updated parameters) and the save's dispatch are inside it; the manifest rows are
written by a watcher thread once MaxText's save has committed, never by the loop. The conversion
is a separate process's work in the evaluator (MaxText's config, reading the full train state,
unrolling, casting to bf16, writing, then a model built and restored from it); most of its time
at this size is fixed cost, not bytes. The views share the stacked arrays' memory (checked) and
keep them float32: they avoid the unscan copy, not the read, and not the bf16 cast the
evaluator's fingerprint check expects (docs/maxtext.md). On a shared machine the per-round
ratios show how much of a difference is noise.
{SECTION_END}
"""


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devtools.bench.maxtext_bench")
    trainer_variants.add_block_flags(ap, steps=24)
    ap.add_argument("--conversions", type=int, default=3)
    ap.add_argument("--in-env", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    trainer_variants.check_block_flags(ap, args)
    if args.rounds < 1 or args.conversions < 1:
        ap.error("--rounds and --conversions must be at least 1")
    if args.in_env:
        return measure(args)
    from devtools.bench.checkpoint_bench import machine

    where = machine()
    res = run_in_env(args)
    med = {v: statistics.median(res["step_s"][v]) for v in trainer_variants.VARIANTS}
    conv = res["conversion"]
    print(
        json.dumps(
            {
                **trainer_variants.ratios(med),
                "recording_call_s": round(statistics.median(res["recording_s"]), 4),
                "convert_s": round(statistics.median(conv["convert_s"]), 3),
                "restore_s": round(statistics.median(conv["restore_s"]), 3),
                "read_scanned_s": round(statistics.median(conv["read_scanned_s"]), 4),
                "views_s": conv["views_s"],
            }
        ),
        flush=True,
    )
    write_section(
        Path(args.output),
        section(res, args, where),
        SECTION_START,
        SECTION_END,
        new_before=NEW_BEFORE,
    )
    print(f"wrote the MaxText section of {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
