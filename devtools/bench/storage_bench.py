"""Peak checkpoint storage over a run, with retention and without, measured on real files.

Each row replays one forecast run (`rcpflow.planning.forecast.simulate`: when each checkpoint is
written, when each evaluation ends, the verdict, training's end) on a run folder of rcpflow's
own writers (`devtools.synthetic_run`): at each event's time the checkpoint's files are written
(weights, and every `FULL_EVERY`-th a ``train_state/`` as a full-state save), the evaluation's
summary persisted (below the target before the passing step, above it at it), training's
``block_stop`` logged; with retention, `rcpflow.verdict.retention_apply.apply_run` runs after
every event as the run DAG would run it at its earliest (``keep passing``, ``while_training``,
``settled`` once the verdict is in and no evaluation is left). The bytes and checkpoint folders
under the run's ``checkpoints/`` are sampled after every write and every apply (no clock: the
replay is event by event). Forecast beside it: `rcpflow.planning.storage_forecast.storage` of
the same run.

    python -m devtools.bench.storage_bench [--out BENCHMARKS.md]

writes the section between ``<!-- storage-bench:start -->`` and ``<!-- storage-bench:end -->``.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from devtools.synthetic_run import make_run, write_eval
from rcpflow.files.layout import CHECKPOINT_STATE_DIR
from rcpflow.files.markdown_sections import write_section
from rcpflow.planning.forecast import Forecast, Scenario, Schedule, simulate
from rcpflow.planning.storage_forecast import TB, CheckpointSizes, storage
from rcpflow.verdict.retention import RetentionPolicy
from rcpflow.verdict.retention_apply import apply_run

START, END = "<!-- storage-bench:start -->", "<!-- storage-bench:end -->"
# The rehearsal profile's timings (rcpflow/planning/rehearsal.py): a step 185 s, an evaluation
# 1700 s; the reference batch size's validation start 18, passing at 26 of 40 steps.
STEP_S, EVAL_S, VAL_START, PASSING, MAX_STEPS = 185.0, 1700.0, 18, 26, 40
# Scaled sizes (the ratios are what is measured): weights 1 kB, a full state 5 kB more.
WEIGHTS_BYTES, STATE_BYTES, FULL_EVERY = 1000, 5000, 5
ROWS: tuple[tuple[Schedule, int], ...] = (
    ("during_training", 1),
    ("during_training", 3),
    ("during_training", 10),
    ("after_training", 3),
)
POLICY = RetentionPolicy("passing", while_training=True)


@dataclass(frozen=True)
class Measured:
    peak_bytes: int
    peak_checkpoints: int


def _sample(checkpoints: Path) -> tuple[int, int]:
    """(bytes, checkpoint folders) under the run's checkpoints/."""
    if not checkpoints.exists():
        return 0, 0
    size = sum(
        os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(checkpoints) for f in files
    )
    return size, sum(1 for p in checkpoints.iterdir() if p.is_dir())


def replay(f: Forecast, run_dir: str, retention: bool) -> Measured:
    """Run `f`'s events on files in `run_dir`; the peak bytes and checkpoints sampled."""
    s = f.scenario
    first = s.val_start_at
    run = make_run(run_dir, max_steps=s.max_steps, last_step=f.steps_trained, val_start_at=first)
    log = run.log_file.read_text()
    training = "".join(line for line in log.splitlines(True) if "block_stop" not in line)
    run.log_file.write_text(training)  # training runs: no block_stop yet
    events: list[tuple[float, int, str, int]] = []  # (time, order, what, step)
    for k in range(first, f.steps_trained + 1):
        events.append((k * s.step_seconds, 0, "write", k))
    for e in f.evaluations:
        if e.outcome == "needed":
            events.append((e.end_s, 1, "evaluated", e.step))
    events.append((f.training_end_s, 2, "training ended", 0))
    last_eval = max(e.end_s for e in f.evaluations)
    events.append((max(f.verdict_s, last_eval), 3, "settled", 0))
    peak = peak_count = 0
    ended = settled = False
    checkpoints = Path(run.layout.checkpoints_dir)
    for _t, _order, what, step in sorted(events):
        if what == "write":
            folder = Path(run.layout.checkpoint(step))
            folder.mkdir(parents=True)
            (folder / "weights").write_bytes(b"w" * WEIGHTS_BYTES)
            if (step - first) % FULL_EVERY == 0:
                (folder / CHECKPOINT_STATE_DIR).mkdir()
                (folder / CHECKPOINT_STATE_DIR / "state").write_bytes(b"s" * STATE_BYTES)
        elif what == "evaluated":
            write_eval(run, step, 0.8 if step == s.passing_step else 0.5)
        elif what == "training ended":
            run.log_file.write_text(log)
            ended = True
        else:
            settled = ended
        size, count = _sample(checkpoints)
        peak, peak_count = max(peak, size), max(peak_count, count)
        if retention:
            apply_run(run_dir, POLICY, settled=settled)
    return Measured(peak, peak_count)


def rows() -> list[str]:
    sizes = CheckpointSizes(WEIGHTS_BYTES / TB, STATE_BYTES / TB, FULL_EVERY)
    out = []
    for schedule, window in ROWS:
        scenario = Scenario(STEP_S, EVAL_S, VAL_START, MAX_STEPS, PASSING, schedule, window)
        f = simulate(scenario)
        with tempfile.TemporaryDirectory(prefix="rcpflow-storage-bench-") as tmp:
            without = replay(f, f"{tmp}/without", retention=False)
            kept = replay(f, f"{tmp}/with", retention=True)
        forecast = storage(f, sizes, retention=True)
        forecast_without = storage(f, sizes, retention=False)
        target = window + 2 + 1  # W + 2 evaluation checkpoints plus one full-state save
        out.append(
            f"| {schedule} | {window} | {f.steps_trained - VAL_START + 1} | "
            f"{without.peak_checkpoints} | {kept.peak_checkpoints} "
            f"({'within' if kept.peak_checkpoints <= target else 'above'} W+2+1 = {target}) | "
            f"{kept.peak_bytes / without.peak_bytes:.2f} | "
            f"{kept.peak_bytes / (forecast.peak_tb * TB):.2f} | "
            f"{without.peak_bytes / (forecast_without.peak_tb * TB):.2f} |"
        )
    return out


def section() -> str:
    head = (
        "## Checkpoint storage with retention (`python -m devtools.bench.storage_bench`)\n\n"
        f"Forecast runs replayed on files (step {STEP_S:g} s, evaluation {EVAL_S:g} s, validation "
        f"from step {VAL_START}, passing at {PASSING}, at most {MAX_STEPS} steps; a full-state "
        f"save every {FULL_EVERY} checkpoints, {STATE_BYTES // WEIGHTS_BYTES}x the weights), "
        "peaks sampled after every write and every retention apply (keep passing, while "
        "training, settled at the verdict). Peak ratio: with retention / without; measured / "
        "forecast: the peak bytes against `rcpflow forecast`'s storage model of the same run. "
        "The W + 2 (+ one full state) bound holds when W evaluations keep pace with training "
        f"(W x {STEP_S:g} s >= {EVAL_S:g} s: W >= {math.ceil(EVAL_S / STEP_S)}); with fewer, "
        "checkpoints wait unevaluated for a slot and the rule keeps them (they may yet be "
        "needed); after training nothing is evaluated, so nothing goes, before training ends.\n\n"
        "| schedule | W | checkpoints written | peak checkpoints without | peak checkpoints with "
        "| peak bytes with / without | with: measured / forecast | without: measured / "
        "forecast |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    return "\n".join([head, *rows()])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="BENCHMARKS.md")
    args = p.parse_args(argv)
    body = section()
    print(body)
    write_section(args.out, body, START, END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
