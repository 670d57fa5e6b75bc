"""``make bench-verdict``: time to verdict, evaluating after training vs during it, measured in
one run under the real scheduler, into BENCHMARKS.md (its own section).

    python -m devtools.bench.verdict_bench [--seed 1] [--global-batch-size 1024] [--max-steps 60]

One seed of ``mlperf_grpo_run`` on the local backend, four times: ``eval_schedule``
{after_training, during_training} x ``eval_window`` {1, 3}, each on a fresh private Airflow
(`devtools.servers.airflow_server`: api-server, scheduler, dag-processor, triggerer on
127.0.0.1). The trainer is the toy at a large global batch (1024 generations per step, 4x the
default), so that a training step is not negligible against an evaluation (at the default
batch the toy trains a whole run in less time than one evaluation takes); validation starts at
the recipe's step for that batch. Same seed, same trajectory: every configuration crosses the
target at the same step, which the bench checks.

Per configuration, from the run's own files (manifest, summaries) and the trigger time:
- verdict: when the persisted summaries first decided the run (the latest ``eval_stop`` of the
  steps up to the passing one: only then is every lower step known to be below target);
- verdict ratio = (verdict - trigger) / ((passing step's weight update - trigger) + that
  step's evaluation time): 1.0 is evaluating each checkpoint the moment it exists, with no
  orchestration cost;
- steps trained (the manifest's last row; fewer than max_steps when training was stopped at
  the verdict), evaluations run (summaries written) and how many of them were beyond the
  passing step (wasted).
Also the measured training-step / evaluation time ratio of the configuration. No JAX here: the
jobs are subprocesses.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devtools.bench.proportions_bench import (
    PROPORTIONS,
    PROPORTIONS_END,
    PROPORTIONS_START,
    run_proportions,
)
from devtools.bench.run_verdicts import RUN_TIMEOUT_S, WORKDIR, iso_ms, run_verdict
from devtools.servers.airflow_server import (
    LocalAirflow,
    repo_config,
)
from rcpflow import recipe
from rcpflow.files.markdown_sections import write_section
from tasks.deployment import ENV_VAR, REPO_ROOT
from tasks.jobs.command import TRAIN_JOB
from tasks.names import RUN_DAG_ID

SECTION_START = "<!-- verdict-bench:start -->"
SECTION_END = "<!-- verdict-bench:end -->"
CONFIGS: tuple[tuple[str, int], ...] = (
    ("after_training", 1),
    ("after_training", 3),
    ("during_training", 1),
    ("during_training", 3),
)


@dataclass(frozen=True)
class Outcome:
    schedule: str
    window: int
    passing_step: int
    verdict_ratio: float
    trigger_to_verdict_s: float
    trigger_to_run_end_s: float
    steps_trained: int
    max_steps: int
    evaluations: int
    wasted: int
    step_s: float  # median training step (weight update to weight update)
    eval_s: float  # median evaluation (eval_start to eval_stop)
    # The passing step's path from its weight update, in s: its evaluate task started; its
    # evaluation started (eval_start: after the job's start, restore, compile); it ended.
    task_start_s: float
    eval_start_s: float
    eval_stop_s: float


def deployment(folder: Path, schedule: str, window: int, width: tuple[int, int]) -> Path:
    """The configuration's deployment: the default jobs, the toy trainer at policy width
    `width` (d_model, d_ff), and a persistent JAX compilation cache per configuration (an
    evaluation compiles what the one before it compiled: what a deployment that evaluates
    many checkpoints would set)."""
    d_model, d_ff = width
    train = [*TRAIN_JOB.argv, "--d-model", str(d_model), "--d-ff", str(d_ff)]
    path = folder / "deployment.toml"
    path.write_text(
        f'eval_schedule = "{schedule}"\n'
        f"eval_window = {window}\n"
        "checkpoint_poll_seconds = 0.5\n"
        "\n[job_env]\n"
        'JAX_PLATFORMS = "cpu"\n'
        f'JAX_COMPILATION_CACHE_DIR = "{folder / "jax_cache"}"\n'
        'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS = "0"\n'
        "\n[jobs.train]\n"
        f"command = {json.dumps(train)}\n"
    )
    return path


def measure(
    run_dir: str,
    schedule: str,
    window: int,
    trigger_ms: int,
    end_ms: int,
    evaluate_started_ms: dict[int, int],
) -> Outcome:
    rows, summaries, step, decided_ms = run_verdict(run_dir)
    passed = summaries[step]
    update_ms = next(r.timestamp_ms for r in rows if r.step == step)
    eval_ms = passed.eval_stop_ms - passed.eval_start_ms
    ideal = (update_ms - trigger_ms) + eval_ms
    stamps = [r.timestamp_ms for r in rows]
    return Outcome(
        schedule=schedule,
        window=window,
        passing_step=step,
        verdict_ratio=(decided_ms - trigger_ms) / ideal,
        trigger_to_verdict_s=(decided_ms - trigger_ms) / 1000,
        trigger_to_run_end_s=(end_ms - trigger_ms) / 1000,
        steps_trained=rows[-1].step,
        max_steps=rows[0].max_steps,
        evaluations=len(summaries),
        wasted=sum(1 for s in summaries if s > step),
        step_s=statistics.median(b - a for a, b in itertools.pairwise(stamps)) / 1000,
        eval_s=statistics.median(
            (s.eval_stop_ms - s.eval_start_ms) / 1000 for s in summaries.values()
        ),
        task_start_s=(evaluate_started_ms[step] - update_ms) / 1000,
        eval_start_s=(passed.eval_start_ms - update_ms) / 1000,
        eval_stop_s=(passed.eval_stop_ms - update_ms) / 1000,
    )


def run_config(
    schedule: str,
    window: int,
    *,
    seed: int,
    global_batch_size: int,
    max_steps: int,
    width: tuple[int, int],
) -> Outcome:
    folder = WORKDIR / f"{schedule}_w{window}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config = repo_config(
        folder / "airflow",
        parallelism=window + 2,  # training, the window, and a task around them
        env={ENV_VAR: str(deployment(folder, schedule, window, width))},
    )
    run_dir = str(folder / "run")
    conf = {
        "run_dir": run_dir,
        "seed": seed,
        "global_batch_size": global_batch_size,
        "max_steps": max_steps,
        "val_start_at": None,  # the recipe's
        "division": "open",
    }
    with LocalAirflow(config) as airflow:
        run = airflow.timed_run(RUN_DAG_ID, conf, RUN_TIMEOUT_S)
        tis = airflow.task_instances(RUN_DAG_ID, run.run_id)
        if run.state != "success":
            states = {t["task_id"]: t["state"] for t in tis}
            raise RuntimeError(f"{schedule} W={window}: run {run.state}: {states}")
    trigger_ms, end_ms = run.trigger_ms, run.end_ms
    # evaluate instances are labelled "step N" in both schedules
    started = {
        int(t["rendered_map_index"].removeprefix("step ")): iso_ms(t["start_date"])
        for t in tis
        if t["task_id"].endswith(".evaluate")
        and t["start_date"]
        and str(t["rendered_map_index"]).startswith("step ")
    }
    outcome = measure(run_dir, schedule, window, trigger_ms, end_ms, started)
    print(json.dumps(outcome.__dict__), flush=True)
    return outcome


def table(outcomes: Sequence[Outcome]) -> str:
    lines = [
        "| schedule | W | verdict ratio | trigger to verdict | steps trained | evaluations run "
        "(wasted) | trigger to run end | training step / evaluation |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.schedule.removesuffix('_training')} | {o.window} | {o.verdict_ratio:.2f} "
            f"| {o.trigger_to_verdict_s:.0f} s | {o.steps_trained} of {o.max_steps} "
            f"| {o.evaluations} ({o.wasted}) | {o.trigger_to_run_end_s:.0f} s "
            f"| {o.step_s:.1f} s / {o.eval_s:.1f} s |"
        )
    return "\n".join(lines)


def path_table(outcomes: Sequence[Outcome]) -> str:
    lines = [
        "| schedule | W | evaluate task started | evaluation started | evaluation ended |",
        "| --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.schedule.removesuffix('_training')} | {o.window} | +{o.task_start_s:.1f} s "
            f"| +{o.eval_start_s:.1f} s | +{o.eval_stop_s:.1f} s |"
        )
    return "\n".join(lines)


def section(
    outcomes: Sequence[Outcome],
    *,
    seed: int,
    global_batch_size: int,
    width: tuple[int, int],
    when: str,
    load: str,
) -> str:
    step_s = statistics.median(o.step_s for o in outcomes)
    eval_s = statistics.median(o.eval_s for o in outcomes)
    steps = sorted({o.passing_step for o in outcomes})
    return "\n".join(
        [
            SECTION_START,
            "## Time to verdict: evaluating after training vs during it",
            "",
            "Written by `make bench-verdict` (`python -m devtools.bench.verdict_bench`): one seed "
            "of `mlperf_grpo_run` under the real scheduler (local Airflow on 127.0.0.1), once per "
            "configuration, all in one run.",
            "",
            f"- Date: {when}; {platform.machine()}, nproc {os.cpu_count()}; load average at "
            f"start {load}",
            f"- Seed {seed}, the toy policy at width d_model {width[0]}, d_ff {width[1]} and "
            f"global batch size {global_batch_size}, checkpoints from the recipe's validation "
            f"start (step {recipe.val_start_at(global_batch_size)}); first passing step: "
            f"{', '.join(map(str, steps))}; a persistent JAX compilation cache per "
            "configuration (`JAX_COMPILATION_CACHE_DIR` in `[job_env]`)",
            f"- Training step / evaluation time: {step_s:.2f} s / {eval_s:.1f} s = "
            f"{step_s / eval_s:.3f} (medians over all configurations; per configuration in "
            "the last column: evaluations beside training slow its steps on this machine). "
            "The evaluation time is `eval_start` to `eval_stop`; the evaluation job's start "
            "(interpreter, JAX, restore) is in the path table below, not in it.",
            "",
            table(outcomes),
            "",
            "- verdict ratio = (verdict - trigger) / ((passing step's weight update - trigger) + "
            "that step's evaluation time); the verdict is when the summaries first decided the "
            "run (the latest `eval_stop` of the steps up to the passing one).",
            "- Steps trained: the manifest's last row. During training, the DAG writes the stop "
            "request when the verdict is decided and the trainer ends after its current step; "
            "after training, training always runs to max_steps first.",
            "- Evaluations run counts the summaries written; wasted ones are beyond the passing "
            "step (speculative evaluation with W > 1).",
            "",
            "The passing step's path, in seconds after its weight update (the gap to the first "
            "column is the checkpoint's save and commit, the wait's poll and resume, the window; "
            "to the second, the evaluation job's start: interpreter, JAX, restore, compile):",
            "",
            path_table(outcomes),
            SECTION_END,
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.bench.verdict_bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--global-batch-size", type=int, default=8192)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--d-ff", type=int, default=512)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "BENCHMARKS.md")
    parser.add_argument("--only", choices=[f"{s}:{w}" for s, w in CONFIGS], nargs="*", default=None)
    parser.add_argument(
        "--section",
        choices=["toy", "proportions", "both"],
        default="both",
        help="toy: the toy policy's section; proportions: the rehearsal jobs' (default both)",
    )
    parser.add_argument(
        "--scale", type=float, default=0.01, help="the rehearsal jobs' time scale (1/100)"
    )
    parser.add_argument("--proportions-max-steps", type=int, default=60)
    parser.add_argument(
        "--proportions-from",
        type=Path,
        default=None,
        help="write the section from the measurements a run saved (proportions.json)",
    )
    parser.add_argument(
        "--only-proportions",
        choices=[f"{s}:{w}" for s, w in PROPORTIONS],
        nargs="*",
        default=None,
    )
    args = parser.parse_args(argv)
    if args.section in ("proportions", "both"):
        text = run_proportions(args)
        print(text)
        write_section(args.output, text, PROPORTIONS_START, PROPORTIONS_END)
    if args.section == "proportions":
        return 0
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    configs = [c for c in CONFIGS if args.only is None or f"{c[0]}:{c[1]}" in args.only]
    outcomes = [
        run_config(
            schedule,
            window,
            seed=args.seed,
            global_batch_size=args.global_batch_size,
            max_steps=args.max_steps,
            width=(args.d_model, args.d_ff),
        )
        for schedule, window in configs
    ]
    if len({o.passing_step for o in outcomes}) != 1:
        print("warning: the configurations passed at different steps", file=sys.stderr)
    text = section(
        outcomes,
        seed=args.seed,
        global_batch_size=args.global_batch_size,
        width=(args.d_model, args.d_ff),
        when=when,
        load=load,
    )
    print(text)
    write_section(args.output, text, SECTION_START, SECTION_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
