"""``make bench`` (its Slurm section): the reference's schedule against rcpflow's on a private
Slurm at the benchmark's proportions, and Slurm's own latency, into BENCHMARKS.md.

    python -m devtools.bench.slurm_bench [--seed 1] [--max-steps 60] [--scale 0.01] [--no-poll]
    python -m devtools.bench.slurm_bench --rows-from LOG   # the section again from a run's log

One seed of ``mlperf_grpo_run`` with the rehearsal jobs (`docker/deployment.rehearsal.toml`:
the profile's step 185 s and evaluation 1,700 s, both times `--scale`) on the private Slurm
(`devtools.servers.slurm_cluster`, two nodes on this machine), three times, each on a fresh
private Airflow: the reference's schedule (evaluation after training in the training's own
allocation, W = 1: ``slurm.eval_in_training_allocation``; the rehearsal evaluator's
Tunix-style result imported there by the batch script), ``after_training`` W = 3 and
``during_training`` W = 3 (evaluation jobs of their own). Training is a 2-node job (the
profile's 128 chips; the rehearsal trainer runs on the first node, the second is held as a
real trainer's would be), an evaluation a 1-node job (its 64 chips). Measured from the run's
files and Slurm's records: time to verdict (the trigger to the latest ``eval_stop`` of the
steps up to the passing one) and node-hours (each Slurm job's run time x its nodes), each as a
ratio over the reference's, beside the same ratios of `rcpflow.planning.forecast.simulate`.
Then Slurm's own latency over `--jobs` trivial jobs: the sbatch call, submit to running (as
squeue first shows it), and a job's end to the watch seeing it.

``--poll-only``: the cost of one poll of one job through `SlurmHook` (bytes its client
commands print, seconds) with 10,000 foreign jobs in the queue, over an empty queue's, on
each Slurm version (22.05's ``squeue --json`` ignores every filter), into its own block of
the Slurm section (`POLL_START`); the full run writes it too, unless ``--no-poll``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.bench.proportions_bench import (
    POLL_S,
    PROFILE,
    REHEARSAL_DEPLOYMENT,
    rehearsal_scenario,
)
from devtools.bench.run_verdicts import run_verdict
from devtools.servers.airflow_server import LocalAirflow, repo_config
from devtools.servers.slurm_cluster import VERSIONS, NodeSpec, SlurmCluster, SlurmVersion
from rcpflow import recipe
from rcpflow.files.markdown_sections import write_section
from rcpflow.planning.forecast import simulate
from tasks.backends.slurm.script import PROCESS_ID_ENV
from tasks.deployment import ENV_VAR, REPO_ROOT

RUN_DAG = "mlperf_grpo_run"
WORKDIR = REPO_ROOT / ".airflow" / "slurm_bench"
START = "<!-- slurm-bench:start -->"
END = "<!-- slurm-bench:end -->"
POLL_START = "<!-- slurm-poll-bench:start -->"
POLL_END = "<!-- slurm-poll-bench:end -->"
FOREIGN_JOBS = 10_000
POLLS = 5
RUN_TIMEOUT_S = 30 * 60
SHIPPED_SCALE = "0.005"  # the --time-scale docker/deployment.rehearsal.toml ships with
# The goal (issue 34): rcpflow's best schedule against the reference's, as ratios over it.
GOAL_TIME, GOAL_NODE_HOURS = 0.4, 1.0
TRAIN_NODES, EVAL_NODES = 2, 1
# (label, eval_schedule, eval_window, evaluation in the training's allocation)
CONFIGS: tuple[tuple[str, str, int, bool], ...] = (
    ("reference: after training, in the training's allocation", "after_training", 1, True),
    ("rcpflow after_training", "after_training", 3, False),
    ("rcpflow during_training", "during_training", 3, False),
)


@dataclass(frozen=True)
class Row:
    label: str
    schedule: str
    window: int
    passing_step: int
    verdict_s: float
    node_s: float
    jobs: int
    evaluations: int
    steps_trained: int
    train_start_s: float  # the trigger to the training job's start (Slurm's)
    train_s: float  # the training job's run time (with the reference's evaluations in it)
    eval_s: float  # an evaluation's eval times (median of the summaries)
    forecast_verdict_s: float  # `simulate`'s, from run_start
    forecast_node_s: float


def deployment(folder: Path, schedule: str, window: int, in_allocation: bool, scale: float) -> Path:
    """The shipped rehearsal deployment's jobs at time scale `scale` on the private Slurm."""
    shipped = tomllib.loads(REHEARSAL_DEPLOYMENT.read_text())["jobs"]

    def scaled(argv: list[str]) -> list[str]:
        return [str(scale) if item == SHIPPED_SCALE else item for item in argv]

    # One trainer process on the 2-node allocation: task 0 trains, task 1 holds its node.
    train = ["bash", "-c", f'[ "${PROCESS_ID_ENV}" = 0 ] || exit 0; exec "$@"', "rank0"]
    train += scaled(shipped["train"]["command"])
    evaluate, result = scaled(shipped["evaluate"]["command"]), shipped["evaluate"]["result"]
    path = folder / "deployment.toml"
    path.write_text(
        f"""backend = "slurm"
storage_root = "{folder}"
eval_schedule = "{schedule}"
eval_window = {window}
checkpoint_poll_seconds = {POLL_S}

[slurm]
transport = "local"
working_dir = "{REPO_ROOT}"
log_dir = "{folder / "slurm-logs"}"
python = "{sys.executable}"
poll_interval_s = 1.0
eval_in_training_allocation = {"true" if in_allocation else "false"}

[slurm.train]
nodes = {TRAIN_NODES}
time_limit = "30"
signal_grace_s = 60

[slurm.evaluate]
nodes = {EVAL_NODES}
time_limit = "15"
signal_grace_s = 30

[jobs.train]
command = {json.dumps(train)}

[jobs.evaluate]
command = {json.dumps(evaluate)}
result = {{ format = {json.dumps(result["format"])}, path = {json.dumps(result["path"])} }}
"""
    )
    return path


def slurm_jobs(cluster: SlurmCluster, names: set[str]) -> list[dict[str, Any]]:
    """Every job of `names` slurmctld still knows (MinJobAge is an hour) that ran."""
    found = json.loads(cluster.client("squeue", "--json", "--states=all"))
    return [j for j in found["jobs"] if j["name"] in names and j["start_time"] and j["end_time"]]


def forecast(
    schedule: str, window: int, passing_step: int, *, scale: float, max_steps: int
) -> tuple[float, float]:
    """`simulate`'s time to verdict (from run_start) and node-seconds (a chip a node here) for
    the profile's times at `scale`, the waits polling every `POLL_S`, no task-start latency."""
    scenario = rehearsal_scenario(
        schedule, window, passing_step, scale=scale, max_steps=max_steps,
        train_chips=TRAIN_NODES, eval_chips=EVAL_NODES, poll_seconds=POLL_S,
    )  # fmt: skip
    f = simulate(scenario)
    return f.verdict_s, (f.train_chip_hours + f.eval_chip_hours) * 3600


def run_config(
    cluster: SlurmCluster,
    label: str,
    schedule: str,
    window: int,
    in_allocation: bool,
    *,
    seed: int,
    max_steps: int,
    scale: float,
) -> Row:
    from tasks.backends.slurm.adapter import job_name

    folder = WORKDIR / f"{schedule}_w{window}{'_in_allocation' if in_allocation else ''}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = deployment(folder, schedule, window, in_allocation, scale)
    env = {ENV_VAR: str(path), **cluster.env}
    config = repo_config(folder / "airflow", parallelism=window + 4, env=env)
    run_dir = str(folder / "run")
    conf = {
        "run_dir": run_dir,
        "seed": seed,
        "global_batch_size": recipe.REFERENCE_BATCH_SIZE,
        "max_steps": max_steps,
        "val_start_at": None,
        "division": "open",
        "eval_schedule": schedule,
        "eval_window": window,
    }
    with LocalAirflow(config) as airflow:
        run = airflow.timed_run(RUN_DAG, conf, RUN_TIMEOUT_S)
    if run.state != "success":
        raise RuntimeError(f"{label}: run {run.state}; see {folder}")
    run_id, trigger_ms = run.run_id, run.trigger_ms
    rows, summaries, step, verdict_ms = run_verdict(run_dir)
    train_name = job_name(RUN_DAG, run_id, "train")
    names = {train_name} | {job_name(RUN_DAG, run_id, f"eval-{r.step}") for r in rows}
    jobs = slurm_jobs(cluster, names)
    (train,) = [j for j in jobs if j["name"] == train_name]
    forecast_verdict_s, forecast_node_s = forecast(
        "reference" if in_allocation else schedule, window, step,
        scale=scale, max_steps=max_steps,
    )  # fmt: skip
    row = Row(
        label=label,
        schedule="reference" if in_allocation else schedule,
        window=window,
        passing_step=step,
        verdict_s=(verdict_ms - trigger_ms) / 1000,
        node_s=sum((j["end_time"] - j["start_time"]) * j["node_count"] for j in jobs),
        jobs=len(jobs),
        evaluations=len(summaries),
        steps_trained=rows[-1].step,
        train_start_s=train["start_time"] - trigger_ms / 1000,
        train_s=train["end_time"] - train["start_time"],
        eval_s=statistics.median(
            (v.eval_stop_ms - v.eval_start_ms) / 1000 for v in summaries.values()
        ),
        forecast_verdict_s=forecast_verdict_s,
        forecast_node_s=forecast_node_s,
    )
    print(json.dumps(row.__dict__), flush=True)
    return row


@dataclass(frozen=True)
class Latency:
    sbatch_s: list[float]
    to_running_s: list[float]
    end_seen_s: list[float]


def latency(cluster: SlurmCluster, jobs: int) -> Latency:
    """`jobs` trivial jobs, one at a time, watched every 0.05 s through the hook."""
    from tasks.backends.slurm.hooks import SlurmHook
    from tasks.backends.slurm.script import BatchJob
    from tasks.backends.slurm.settings import SlurmJobShape, SlurmSettings

    folder = WORKDIR / "latency"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ.update(cluster.env)
    settings = SlurmSettings(working_dir=str(folder), log_dir=str(folder), python=sys.executable)
    hook = SlurmHook(settings)
    shape = SlurmJobShape(time_limit="5", signal_grace_s=30)
    sbatch, running, seen = [], [], []
    for i in range(jobs):
        end_file = folder / f"end-{i}"
        code = (
            "import time,pathlib; time.sleep(1); "
            f"pathlib.Path({str(end_file)!r}).write_text(repr(time.time()))"
        )
        job = BatchJob(
            f"latency-{i}", (sys.executable, "-c", code), shape, str(folder), str(folder)
        )
        started = time.time()
        submitted = hook.submit(job)
        sbatch.append(time.time() - started)
        while hook.job(submitted.job_id).state == "PENDING":
            time.sleep(0.05)
        running.append(time.time() - started)
        while not hook.job(submitted.job_id).finished:
            time.sleep(0.05)
        seen.append(time.time() - float(end_file.read_text()))
    return Latency(sbatch, running, seen)


@dataclass(frozen=True)
class PollCost:
    """One poll of one running job through `SlurmHook`: bytes its commands printed (median
    over `POLLS`) and seconds (median), with an empty queue and with `foreign` jobs."""

    version: str
    foreign: int
    empty_bytes: int
    empty_s: float
    full_bytes: int
    full_s: float


@dataclass
class _CountingRunner:
    """The hook's local runner, counting what each command printed."""

    env: dict[str, str]
    printed: list[int]

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout_s: float) -> Any:
        from tasks.backends.slurm.hooks import LocalRunner

        result = LocalRunner(self.env).run(argv, stdin=stdin, timeout_s=timeout_s)
        self.printed.append(len(result.stdout.encode()) + len(result.stderr.encode()))
        return result


def _polls(hook: Any, runner: _CountingRunner, job_id: str) -> tuple[int, float]:
    sizes, times = [], []
    for _ in range(POLLS):
        before = len(runner.printed)
        started = time.perf_counter()
        info = hook.job(job_id)
        times.append(time.perf_counter() - started)
        sizes.append(sum(runner.printed[before:]))
        assert info.state == "RUNNING", f"job {job_id}: {info.state}"
    return int(statistics.median(sizes)), statistics.median(times)


def poll_cost(version: SlurmVersion, foreign: int = FOREIGN_JOBS) -> PollCost:
    """A running job of ours polled through the product's hook, then `foreign` held jobs
    of another name submitted (sbatch in one shell loop on the cluster), then polled again."""
    from tasks.backends.slurm.hooks import SlurmHook
    from tasks.backends.slurm.settings import SlurmSettings

    cluster = SlurmCluster(version=version, max_job_count=foreign + 100, min_job_age_s=3600)
    try:
        cluster.start()
        folder = str(cluster.root / "jobs")
        ours = cluster.client(
            "sbatch", "--parsable", "-J", "rcpflow-ours", "-o", "/dev/null", "--wrap", "sleep 3600"
        ).strip()
        deadline = time.monotonic() + 60
        while "JobState=RUNNING" not in cluster.client("scontrol", "show", "job", "-o", ours):
            assert time.monotonic() < deadline, f"job {ours} did not start"
            time.sleep(0.2)
        runner = _CountingRunner(cluster.env, [])
        hook = SlurmHook(SlurmSettings(working_dir=folder, log_dir=folder), runner=runner)
        empty_bytes, empty_s = _polls(hook, runner, ours)
        # By full path: the cluster's PATH (24.11: wrappers first) reaches its shell too.
        loop = (
            f"i=0; while [ $i -lt {foreign} ]; do /usr/bin/sbatch --hold -J foreign -o "
            "/dev/null --wrap true >/dev/null || exit 1; i=$((i+1)); done"
        )
        started = time.monotonic()
        cluster.client("sh", "-c", loop, timeout_s=3600)
        print(f"Slurm {version}: {foreign} jobs in {time.monotonic() - started:.0f} s", flush=True)
        full_bytes, full_s = _polls(hook, runner, ours)
    finally:
        cluster.cleanup()
    return PollCost(version, foreign, empty_bytes, empty_s, full_bytes, full_s)


def poll_section(costs: Sequence[PollCost]) -> str:
    lines = [
        POLL_START,
        f"Poll with {costs[0].foreign:,} foreign jobs in the queue (`--poll-only`; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): one poll of one running job "
        "through `SlurmHook.job` (what each watch does every few seconds), the bytes its "
        f"client commands printed and its seconds (medians of {POLLS}), over an empty queue's; "
        "the foreign jobs are held jobs of another name (one user here). 24.11's seconds "
        "include entering its root (`unshare` and `chroot`, docs/slurm-versions.md); the "
        "machine was shared, so seconds move with its load, bytes do not.",
        "",
        f"| Slurm | poll, empty queue | poll, {costs[0].foreign:,} foreign jobs | bytes ratio | "
        "seconds ratio |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in costs:
        lines.append(
            f"| {c.version} | {c.empty_bytes:,} B, {c.empty_s:.3f} s | "
            f"{c.full_bytes:,} B, {c.full_s:.3f} s | {c.full_bytes / c.empty_bytes:,.0f} | "
            f"{c.full_s / c.empty_s:.1f} |"
        )
    lines.append(POLL_END)
    return "\n".join(lines)


def _med(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} s (max {max(values):.2f} s)"


def _latency_s(r: Row) -> float:
    """What the measured time to verdict has over the forecast's: the trigger to the training
    job's start, and every later latency (Airflow's task starts, Slurm's job starts, imports)."""
    return r.verdict_s - r.forecast_verdict_s


def _from_start(r: Row) -> float:
    """Time to verdict from the training job's start (the forecast's time 0, run_start): the
    trigger's latency, the same path in every configuration, left out."""
    return r.verdict_s - r.train_start_s


def _full_scale_ratio(r: Row, ref: Row, scale: float) -> float:
    """The time-to-verdict ratio with the profile's own times and the same seconds of latency:
    an estimate, not a measurement (the latencies do not grow with the job times)."""
    return (r.forecast_verdict_s / scale + _latency_s(r)) / (
        ref.forecast_verdict_s / scale + _latency_s(ref)
    )


def run_facts() -> dict[str, str]:
    """When the run ended and the load then (a log line, so that --rows-from writes them too)."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def section(
    rows: Sequence[Row], lat: Latency, args: argparse.Namespace, version: str, facts: dict[str, str]
) -> str:
    ref = rows[0]
    best = min(rows[1:], key=lambda r: r.verdict_s)
    time_ratio, node_ratio = best.verdict_s / ref.verdict_s, best.node_s / ref.node_s
    lines = [
        START,
        "## Slurm",
        "",
        "Written by `make bench` (`python -m devtools.bench.slurm_bench`), all rows in one run: "
        f"one seed (seed {args.seed}, gbs {recipe.REFERENCE_BATCH_SIZE}, max_steps "
        f"{args.max_steps}) of `mlperf_grpo_run` with the rehearsal jobs "
        "(`docker/deployment.rehearsal.toml`: the profile's step "
        f"{PROFILE.step_seconds:,.0f} s and evaluation {PROFILE.eval_seconds:,.0f} s) at "
        f"{args.scale:g} of their times (a step {PROFILE.step_seconds * args.scale:.2f} s, an "
        f"evaluation {PROFILE.eval_seconds * args.scale:.1f} s: the benchmark's proportions) on "
        f"the private Slurm {version} (slurmctld and two slurmd nodes on this machine, "
        f"`devtools/servers/slurm_cluster.py`). Training is a {TRAIN_NODES}-node job (the "
        f"profile's {PROFILE.train_chips} chips: the rehearsal trainer runs on its first node, "
        f"the second is held as a real trainer's would be), an evaluation a {EVAL_NODES}-node "
        f"job (its {PROFILE.eval_chips} chips). The reference's schedule is its own: "
        "`slurm.eval_in_training_allocation`, the training's batch script evaluating the "
        "checkpoints in step order in its allocation after training (W = 1), each result "
        "imported there by the evaluate step's rule (docs/slurm.md). Each configuration on a "
        "fresh private Airflow.",
        "",
        f"- Date: {facts['date']}; {platform.machine()}, nproc {os.cpu_count()}; load average "
        f"at the end: {facts['load']}" + " (other work shared the machine)",
        "",
        "| schedule | W | passing step | time to verdict | ratio | ratio from the training's "
        "start | forecast ratio | node-minutes | ratio | forecast ratio | Slurm jobs | "
        "evaluations | steps trained |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.label} | {r.window} | {r.passing_step} | {r.verdict_s:.0f} s | "
            f"{r.verdict_s / ref.verdict_s:.2f} | {_from_start(r) / _from_start(ref):.2f} | "
            f"{r.forecast_verdict_s / ref.forecast_verdict_s:.2f} | {r.node_s / 60:.1f} | "
            f"{r.node_s / ref.node_s:.2f} | {r.forecast_node_s / ref.forecast_node_s:.2f} | "
            f"{r.jobs} | {r.evaluations} | {r.steps_trained} |"
        )
    lines += [
        "",
        "Where the time went (seconds of this run):",
        "",
        "| schedule | trigger to training job start | training job's run time | an evaluation "
        "(median) | training's start to verdict | forecast of it | measured over the "
        "forecast |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.label} | {r.train_start_s:.0f} | {r.train_s:.0f} | {r.eval_s:.1f} | "
            f"{_from_start(r):.0f} | {r.forecast_verdict_s:.0f} | "
            f"{_from_start(r) - r.forecast_verdict_s:.0f} |"
        )
    met = {True: "met", False: "not met"}
    lines += [
        "",
        f"- Goal: rcpflow's best schedule ({best.label}, W={best.window}) at most "
        f"{GOAL_TIME} of the reference's time to verdict: {time_ratio:.2f}, "
        f"{met[time_ratio <= GOAL_TIME]}; at most {GOAL_NODE_HOURS} of its node-hours: "
        f"{node_ratio:.2f}, {met[node_ratio <= GOAL_NODE_HOURS]}."
        + (
            ""
            if time_ratio <= GOAL_TIME
            else f" Why, from the measured path: the schedule itself forecasts "
            f"{best.forecast_verdict_s / ref.forecast_verdict_s:.2f}; the rest is latency that "
            f"does not scale with the jobs: {_from_start(best) - best.forecast_verdict_s:.0f} s "
            f"after the training's start (the reference's "
            f"{_from_start(ref) - ref.forecast_verdict_s:.0f} s), an evaluation's eval times "
            f"{best.eval_s:.1f} s against the scaled {PROFILE.eval_seconds * args.scale:.1f} s "
            "(its Slurm job's start and the deferred task's resumption before the import; the "
            "reference imports in the allocation right after its srun), and the trigger to the "
            f"training's start, {best.train_start_s:.0f} s against the reference's "
            f"{ref.train_start_s:.0f} s."
        ),
        "- time to verdict: from the run's trigger to the latest `eval_stop` of the steps up to "
        "the passing one (the summaries then decide the run); ratio: over the reference's.",
        "- node-minutes: every Slurm job of the run, its run time (Slurm's start to end) x its "
        "nodes; the reference holds the training's nodes while it evaluates.",
        "- forecast ratio: `rcpflow.planning.forecast.simulate` (the `reference` schedule for "
        "the first row) at the same scaled times, passing step, W, a chip a node, waits polling "
        f"every {POLL_S} s and no task-start latency, over its reference's; its node-hours are "
        "its training plus evaluation chip-hours.",
        "- ratio from the training's start: time to verdict from the training job's start "
        "(the forecast's time 0) over the reference's: the trigger to the training's start "
        "(plan, the train task, sbatch) is the same path in every configuration, and its "
        "seconds moved with the machine's load.",
        "- measured over the forecast: every latency after the training's start: an evaluate "
        "task's start after its wait, its Slurm job's start, the trigger's resumption of the "
        "deferred task, the import; in the reference only each step's `rcpflow status`, `eval "
        "start` and `eval import` in the batch script. These seconds, and the trigger's, do "
        "not scale with the job times: with the profile's own times and the same latencies the "
        "time-to-verdict ratios would be about "
        + ", ".join(f"{_full_scale_ratio(r, ref, args.scale):.2f}" for r in rows[1:])
        + " (an estimate from this run, not a measurement).",
        f"- Slurm's own latency over {len(lat.sbatch_s)} trivial jobs, one at a time, read every "
        f"0.05 s through `SlurmHook`: the sbatch call (with the hook's mkdir and first read) "
        f"{_med(lat.sbatch_s)}; submit to running {_med(lat.to_running_s)}; a job's last "
        f"write to the watch seeing it ended {_med(lat.end_seen_s)}.",
        END,
    ]
    return "\n".join(lines)


def rows_from(log: Path) -> tuple[list[Row], Latency, str, dict[str, str]]:
    """The rows and the latency a run printed (one JSON line each), in its order."""
    rows, found = [], None
    for line in log.read_text().splitlines():
        if line.startswith('{"label"'):
            rows.append(Row(**json.loads(line)))
        elif line.startswith('{"latency"'):
            found = json.loads(line)
    if len(rows) != len(CONFIGS) or found is None:
        raise SystemExit(f"{log}: not a whole run's log ({len(rows)} rows, latency: {found})")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(log.stat().st_mtime))
    facts = {  # a log of a run before these were printed: its end from the file, no load
        "date": found.get("date", f"{when} (the log's last write)"),
        "load": found.get("load", "not in the log"),
    }
    return rows, Latency(**found["latency"]), found["version"], facts


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.bench.slurm_bench")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument(
        "--scale", type=float, default=0.01, help="the rehearsal jobs' time scale (1/100)"
    )
    parser.add_argument("--jobs", type=int, default=10, help="trivial jobs for the latency")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "BENCHMARKS.md")
    parser.add_argument(
        "--poll-only", action="store_true", help="only the poll with 10,000 foreign jobs"
    )
    parser.add_argument(
        "--no-poll", action="store_true", help="the schedules only (the poll block is kept)"
    )
    parser.add_argument(
        "--rows-from",
        type=Path,
        metavar="LOG",
        help="write the section from the rows and latency a run printed (its log), run nothing",
    )
    args = parser.parse_args(argv)
    if args.rows_from is not None:
        rows, lat, version, facts = rows_from(args.rows_from)
        write_section(args.output, section(rows, lat, args, version, facts), START, END)
        print(f"wrote the Slurm section of {args.output} from {args.rows_from}", flush=True)
        return 0
    signal.signal(signal.SIGTERM, _terminate)  # so that `finally` stops what it started
    if not args.no_poll:
        costs = [poll_cost(version) for version in VERSIONS]
        write_section(args.output, poll_section(costs), POLL_START, POLL_END)
        print(f"wrote the Slurm poll block of {args.output}", flush=True)
    if args.poll_only:
        return 0
    nodes = (NodeSpec("n1", 6), NodeSpec("n2", 6))
    cluster = SlurmCluster(nodes, min_job_age_s=3600)
    try:
        cluster.start()
        rows = []
        for label, schedule, window, inside in CONFIGS:
            row = run_config(
                cluster, label, schedule, window, inside,
                seed=args.seed, max_steps=args.max_steps, scale=args.scale,
            )  # fmt: skip
            rows.append(row)
        lat = latency(cluster, args.jobs)
        facts = run_facts()
        print(
            json.dumps({"latency": lat.__dict__, "version": cluster.version, **facts}), flush=True
        )
    finally:
        cluster.cleanup()
    write_section(args.output, section(rows, lat, args, cluster.version, facts), START, END)
    print(f"wrote the Slurm section of {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
