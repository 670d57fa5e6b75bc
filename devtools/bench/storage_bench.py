"""Peak checkpoint storage over a run, with retention and without, measured on real files.

Each row replays one forecast run (`rcpflow.planning.forecast.simulate`: when each checkpoint is
written, when each evaluation ends, the verdict, training's end) on a run folder of rcpflow's
own writers (`devtools.synthetic_run`): at each event's time the checkpoint's files are written
(weights, and every `FULL_EVERY`-th a ``train_state/`` as a full-state save), the evaluation's
summary persisted (below the target before the passing step, above it at it), training's
``block_stop`` logged; with retention, `rcpflow.retention.apply.apply_run` runs after
every event as the run DAG would run it at its earliest (``keep passing``, ``while_training``,
``settled`` once the verdict is in and no evaluation is left). The bytes and checkpoint folders
under the run's ``checkpoints/`` are sampled after every write and every apply (no clock: the
replay is event by event). Forecast beside it: `rcpflow.planning.storage_forecast.storage` of
the same run.

    python -m devtools.bench.storage_bench [--out BENCHMARKS.md]

writes the section between ``<!-- storage-bench:start -->`` and ``<!-- storage-bench:end -->``.

    python -m devtools.bench.storage_bench --rehearsal [--out BENCHMARKS.md]

measures the same on the real thing instead: the three-seed rehearsal submission under the real
scheduler (`devtools.bench.proportions_bench.run_proportion`), per schedule and W once without
retention and once with the deployment's ``[retention]`` (keep passing, while training), each
at its time scale (`REHEARSAL_ROWS`), each seed's ``checkpoints/`` sampled every 0.5 s through
the run; beside it the storage forecast of the same seeds (their passing steps, the row's
measured median task start; with retention once with the row's measured retention lag,
`retention_lag`, and once with none) and what a slot in the eval window is held for
(`slot_seconds`, against W steps: whether W slots keep pace); into the section
between ``<!-- storage-rehearsal:start -->`` and ``<!-- storage-rehearsal:end -->``
(``--rehearsal-from FILE``: from the measurements a run saved).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.bench.proportions_bench import (
    EVAL_RETRIES,
    Models,
    checkpoints_on_storage,
    loaded_row,
    machine,
    rehearsal_scenario,
    run_proportion,
    saved_row,
)
from devtools.synthetic_run import make_run, write_eval
from rcpflow.files.layout import CHECKPOINT_STATE_DIR
from rcpflow.files.markdown_sections import write_section
from rcpflow.planning.forecast import Forecast, Scenario, Schedule, simulate
from rcpflow.planning.storage_forecast import TB, CheckpointSizes, storage
from rcpflow.retention.apply import apply_run
from rcpflow.retention.rule import RetentionPolicy

START, END = "<!-- storage-bench:start -->", "<!-- storage-bench:end -->"
REHEARSAL_START = "<!-- storage-rehearsal:start -->"
REHEARSAL_END = "<!-- storage-rehearsal:end -->"
# The rehearsal submission's configurations and the time scale each runs at: during training, W
# short of keeping pace with training (3: 3 steps of 185 s against an evaluation's 1700 s) at
# 0.01, and W that keeps pace (10: 1850 s against 1700 s) at 0.1, where the DAG's own seconds
# per evaluation (task starts, polls: they do not scale) fit in those 150 s of slack scaled
# (15 s); at 0.01 they would not (1.5 s), and W=10 would fall behind as W=3 does.
REHEARSAL_ROWS: tuple[tuple[Schedule, int, float], ...] = (
    ("during_training", 3, 0.01),
    ("during_training", 10, 0.1),
)
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
        count, size = checkpoints_on_storage(checkpoints)
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


@dataclass(frozen=True)
class RehearsalRow:
    """One configuration of the rehearsal submission at its time scale, without retention and
    with it: each a `ProportionRow` as `proportions_bench.saved_row` keeps it."""

    schedule: Schedule
    window: int
    scale: float
    without: dict[str, Any]
    kept: dict[str, Any]


def _peak(saved: dict[str, Any]) -> tuple[int, int, int]:
    """(checkpoints written, peak checkpoints, peak bytes): the worst seed of each."""
    storage = saved["storage"]
    return (
        max(s[1] for s in storage), max(s[2] for s in storage), max(s[3] for s in storage)
    )  # fmt: skip


def calibrated(rows: Sequence[RehearsalRow]) -> Models:
    """The forecast's machine model, calibrated once, on the first configuration's run without
    retention (as the proportions section calibrates on its first row), for every row."""
    return Models.measured(loaded_row(rows[0].without), rows[0].scale)


def forecasts(
    saved: dict[str, Any], models: Models, scale: float, max_steps: int
) -> list[Forecast]:
    """The forecast of each seed's run at its passing step, with the machine model `models`
    on the row's measured background (`proportions_bench.machine`)."""
    row = loaded_row(saved)
    overheads = machine(row, models)
    return [
        simulate(
            rehearsal_scenario(
                row.schedule, row.window, seed.passing_step, scale=scale, max_steps=max_steps,
                **overheads,
            )
        )
        for seed in row.seeds
    ]  # fmt: skip


def forecast_peak(
    saved: dict[str, Any],
    models: Models,
    scale: float,
    max_steps: int,
    retention: bool,
    lag_s: float = 0.0,
) -> int:
    """The storage forecast's peak checkpoints of the row's worst seed (`forecasts`), with
    retention each deletion `lag_s` after the rule allows it."""
    return max(
        storage(f, CheckpointSizes(1.0), retention, lag_s).peak_checkpoints
        for f in forecasts(saved, models, scale, max_steps)
    )


def retention_lag(saved: dict[str, Any]) -> float | None:
    """The median seconds from a step's evaluation's end (its summary's ``eval_stop``) to its
    checkpoint's deletion (the run's retention record), over every seed's steps that had both:
    what the DAG adds to the storage forecast's deletion at the evaluation's end (the trigger's
    poll, the evaluate task's resume, the apply)."""
    lags = []
    for seed in saved["seeds"]:
        ends = {int(step): stop for step, _, stop in seed["evaluations"]}
        lags += [t - ends[int(step)] for step, t in seed.get("deletions", ()) if int(step) in ends]
    return statistics.median(lags) if lags else None


def slot_seconds(saved: dict[str, Any]) -> float | None:
    """The median seconds a step holds its slot in the eval window: from its wait's end (let
    go) to its evaluate task's end, over every seed's evaluate tasks that succeeded."""
    held = []
    for seed in saved["seeds"]:
        ends: dict[tuple[str, int], float] = {}
        for t in seed["tasks"]:
            task = t["task_id"].rsplit(".", 1)[-1]
            if task in ("wait", "evaluate") and t["state"] == "success" and t["end_date"]:
                ends[task, t["map_index"]] = t["end_date"]
        held += [end - ends["wait", i] for (task, i), end in ends.items() if task == "evaluate"
                 and ("wait", i) in ends]  # fmt: skip
    return statistics.median(held) if held else None


def _versus(measured: int, forecast: int) -> str:
    """A forecast peak and, in brackets, measured / forecast."""
    return f"{forecast} ({measured / forecast:.2f})"


def rehearsal_rows(rows: Sequence[RehearsalRow], models: Models, max_steps: int) -> list[str]:
    out = []
    for r in rows:
        written, peak_without, bytes_without = _peak(r.without)
        _, peak_with, bytes_with = _peak(r.kept)
        bound = r.window + 2
        lag = max(retention_lag(r.kept) or 0.0, 0.0)
        f_without = forecast_peak(r.without, models, r.scale, max_steps, retention=False)
        f_with = forecast_peak(r.kept, models, r.scale, max_steps, True, lag_s=lag)
        out.append(
            f"| {r.schedule} | {r.window} | {r.scale:g} ({STEP_S * r.scale:.2f} s, "
            f"{EVAL_S * r.scale:.1f} s) | {written} | {peak_without} | {peak_with} "
            f"({'within' if peak_with <= bound else 'above'} W+2 = {bound}) | "
            f"{bytes_with / bytes_without:.2f} | {_versus(peak_with, f_with)} | "
            f"{_versus(peak_without, f_without)} |"
        )
    return out


def _seconds(value: float | None, what: str) -> str:
    return f"{what} (none ran)" if value is None else f"{what} {value:.1f} s (median)"


def rehearsal_section(rows: Sequence[RehearsalRow], max_steps: int, when: str) -> str:
    head = (
        "### Measured on the rehearsal submission (`python -m devtools.bench.storage_bench "
        "--rehearsal`)\n\n"
        "The three-seed submission (`mlperf_grpo_submission`) under the real scheduler with the "
        "rehearsal jobs at a fraction of their times (the row's time scale: a step "
        f"{STEP_S:g} s and an evaluation {EVAL_S:g} s times it; validation from step "
        f"{VAL_START}, max_steps {max_steps}), once without retention and once with the "
        "deployment's `[retention] keep = \"passing\", while_training = true` (each step's "
        "evaluate task deletes what its result lets go before it ends, so before its slot in "
        "the eval window frees; the `retention` task once the run is settled); each seed's "
        "`checkpoints/` sampled every 0.5 s through the run (step folders and their bytes). The "
        "rehearsal trainer saves weights only (no full-state save), so the bound is W + 2: the "
        "W checkpoints being evaluated, the newest waiting for a slot, the passing one. "
        f"`eval_retries = {EVAL_RETRIES}` (a verdict lost to Airflow's deferral race is "
        "retried, docs/slurm.md). Forecast: `rcpflow.planning.storage_forecast.storage` of each "
        "seed's run at its passing step, its times from `rcpflow.planning.forecast` with the "
        "machine model calibrated once, on the first configuration's run without retention "
        "(as in the proportions section, `devtools.bench.load_calibration`), on each run's "
        "measured background; with retention each deletion the row's measured retention lag "
        "later (`--retention-lag-s`: the median from an evaluation's end to its checkpoint's "
        "deletion in the run's retention record, listed below); in brackets measured / "
        "forecast. Nothing is fitted to a peak. "
        f"Every number is the worst seed's.\n\n- Date: {when}; {platform.machine()}, nproc "
        f"{os.cpu_count()}; load average at each start: "
        + "; ".join(
            f"{r.schedule} W={r.window}: {r.without['load']} (without), {r.kept['load']} (with)"
            for r in rows
        )
        + "\n\n| schedule | W | time scale (a step, an evaluation) | checkpoints written | peak "
        "checkpoints without | peak checkpoints with | peak bytes with / without | forecast "
        "peak with | forecast peak without |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    models = calibrated(rows)
    lines = []
    for r in rows:
        slot = slot_seconds(r.kept)
        training = max(s["steps_trained"] for s in r.kept["seeds"]) - VAL_START + 1
        forecast = max(f.steps_trained for f in forecasts(r.kept, models, r.scale, max_steps))
        pace = (
            ""
            if slot is None
            else f" ({'within' if slot <= r.window * STEP_S * r.scale else 'more than'} W steps)"
        )
        lines.append(
            f"- {r.schedule} W={r.window} at {r.scale:g}: "
            + _seconds(slot, "a slot held per evaluation (a wait's end to its evaluate task's end)")
            + pace
            + f", W steps {r.window * STEP_S * r.scale:.1f} s, an evaluation "
            f"{EVAL_S * r.scale:.1f} s; "
            + _seconds(retention_lag(r.kept), "an evaluation's end to its checkpoint's deletion")
            + f"; training wrote {training} checkpoints with retention on, the forecast's run "
            f"{forecast - VAL_START + 1}."
        )
    tail = (
        "\nWhen the bound holds: a checkpoint evaluated below the target is deleted inside its "
        "evaluate task, before its slot frees, so before the verdict a run keeps the W being "
        "evaluated and those waiting for a slot, and the waiting stay few when W slots keep "
        "pace with training: a slot held per evaluation (the evaluation, the evaluate task's "
        "start, the trigger's poll, the task's resume) within W steps. At the verdict the "
        "passing checkpoint stays and the evaluations above it are stopped: their checkpoints "
        "have no summary, so they stay until the run is settled (training ended, the final "
        "`retention` task), with the one or two that training writes before it sees the stop "
        "request: W + 2 again (the storage forecast models both). The DAG's own seconds do not "
        "scale with the jobs: at 0.01 of the times they are more than the W steps of slack, at "
        f"0.1 a fraction of them, at the benchmark's (a step {STEP_S:g} s, an evaluation "
        f"{EVAL_S:g} s) a fraction of one step (the replay above). Where W slots fall behind, "
        "the checkpoints waiting for one pile up and the rule keeps them (they may yet be "
        "needed).\n"
    )
    return "\n".join([head, *rehearsal_rows(rows, models, max_steps), tail, *lines])


def run_rehearsal(
    max_steps: int, saved: Path, only: Sequence[str] | None = None
) -> list[RehearsalRow]:
    """Each `REHEARSAL_ROWS` configuration (or those of `only`, ``schedule:W``) without and
    with retention, saved to `saved` as it goes; with `only`, the rows `saved` holds of the
    others are kept (a row that could not run on a loaded machine is run again alone)."""
    earlier = [RehearsalRow(**r) for r in json.loads(saved.read_text())] if saved.exists() else []
    rows = [r for r in earlier if only is not None and f"{r.schedule}:{r.window}" not in only]
    order = [(s, w) for s, w, _ in REHEARSAL_ROWS]
    for schedule, window, scale in REHEARSAL_ROWS:
        if only is not None and f"{schedule}:{window}" not in only:
            continue
        pair = [
            saved_row(
                run_proportion(
                    schedule,
                    window,
                    scale=scale,
                    max_steps=max_steps,
                    retention=retention,
                    eval_retries=EVAL_RETRIES,
                )
            )
            for retention in (False, True)
        ]
        rows.append(RehearsalRow(schedule, window, scale, *pair))
        rows.sort(key=lambda r: order.index((r.schedule, r.window)))
        saved.write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="BENCHMARKS.md")
    p.add_argument("--rehearsal", action="store_true", help="measure the rehearsal submission")
    p.add_argument("--rehearsal-from", type=Path, default=None, help="its saved measurements")
    p.add_argument("--max-steps", type=int, default=60)
    p.add_argument(
        "--only",
        nargs="*",
        choices=[f"{s}:{w}" for s, w, _ in REHEARSAL_ROWS],
        default=None,
        help="with --rehearsal: these configurations, the others kept from the saved file",
    )
    args = p.parse_args(argv)
    if args.rehearsal or args.rehearsal_from is not None:
        from devtools.bench.run_verdicts import WORKDIR

        if args.rehearsal_from is not None:
            rows = [RehearsalRow(**r) for r in json.loads(args.rehearsal_from.read_text())]
            stamp = args.rehearsal_from.stat().st_mtime
        else:
            WORKDIR.mkdir(parents=True, exist_ok=True)
            saved = WORKDIR / "storage_rehearsal.json"
            rows = run_rehearsal(args.max_steps, saved, args.only)
            stamp = datetime.datetime.now(datetime.UTC).timestamp()
        when = datetime.datetime.fromtimestamp(stamp, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        body = rehearsal_section(rows, args.max_steps, when)
        print(body)
        write_section(args.out, body, REHEARSAL_START, REHEARSAL_END)
        return 0
    body = section()
    print(body)
    write_section(args.out, body, START, END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
