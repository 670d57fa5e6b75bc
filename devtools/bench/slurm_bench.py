"""``make bench`` (its Slurm section): the reference's schedule against rcpflow's on a private
Slurm, and Slurm's own latency, into BENCHMARKS.md.

    python -m devtools.bench.slurm_bench [--seed 1] [--max-steps 30] [--jobs 10]

One seed of ``mlperf_grpo_run`` with the toy jobs on the private Slurm
(`devtools.servers.slurm_cluster`, two nodes on this machine), three times, each on a fresh
private Airflow: the reference's schedule (evaluation after training in the training's own
allocation, W = 1: ``slurm.eval_in_training_allocation``), ``after_training`` W = 3 and
``during_training`` W = 3 (evaluation jobs of their own). Training is a 2-node job, an
evaluation a 1-node job. Measured from the run's files and Slurm's records: time to verdict
(the trigger to the latest ``eval_stop`` of the steps up to the passing one) and node-hours
(each Slurm job's run time x its nodes), each also as a ratio to the reference's. Then Slurm's
own latency over `--jobs` trivial jobs: the sbatch call, submit to running (as squeue first
shows it), and a job's end to the watch seeing it.

``--poll-only``: the cost of one poll of one job through `SlurmHook` (bytes its client
commands print, seconds) with 10,000 foreign jobs in the queue, over an empty queue's, on
each Slurm version (22.05's ``squeue --json`` ignores every filter), into its own block of
the Slurm section (`POLL_START`); the full run writes it too.
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.bench.verdict_bench import run_verdict
from devtools.servers.airflow_server import LocalAirflow, repo_config
from devtools.servers.slurm_cluster import VERSIONS, NodeSpec, SlurmCluster, SlurmVersion
from rcpflow.files.markdown_sections import write_section
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
    window: int
    passing_step: int
    verdict_s: float
    node_s: float
    jobs: int
    evaluations: int
    steps_trained: int


def deployment(folder: Path, schedule: str, window: int, in_allocation: bool) -> Path:
    path = folder / "deployment.toml"
    path.write_text(
        f"""backend = "slurm"
storage_root = "{folder}"
eval_schedule = "{schedule}"
eval_window = {window}
checkpoint_poll_seconds = 0.5

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

[jobs.train.env]
JAX_PLATFORMS = "cpu"

[jobs.evaluate.env]
JAX_PLATFORMS = "cpu"
"""
    )
    return path


def node_seconds(cluster: SlurmCluster, names: set[str]) -> tuple[float, int]:
    """Run time x nodes of every job of `names` slurmctld still knows (MinJobAge is an hour)."""
    found = json.loads(cluster.client("squeue", "--json", "--states=all"))
    total, count = 0.0, 0
    for job in found["jobs"]:
        if job["name"] in names and job["start_time"] and job["end_time"]:
            total += (job["end_time"] - job["start_time"]) * job["node_count"]
            count += 1
    return total, count


def run_config(
    cluster: SlurmCluster,
    label: str,
    schedule: str,
    window: int,
    in_allocation: bool,
    *,
    seed: int,
    max_steps: int,
) -> Row:
    from tasks.backends.slurm.operators import job_name

    folder = WORKDIR / f"{schedule}_w{window}{'_in_allocation' if in_allocation else ''}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    env = {ENV_VAR: str(deployment(folder, schedule, window, in_allocation)), **cluster.env}
    config = repo_config(folder / "airflow", parallelism=window + 4, env=env)
    run_dir = str(folder / "run")
    conf = {
        "run_dir": run_dir,
        "seed": seed,
        "global_batch_size": 256,
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
    names = {job_name(RUN_DAG, run_id, "train")} | {
        job_name(RUN_DAG, run_id, f"eval-{r.step}") for r in rows
    }
    node_s, jobs = node_seconds(cluster, names)
    row = Row(
        label, window, step, (verdict_ms - trigger_ms) / 1000, node_s, jobs, len(summaries),
        rows[-1].step,
    )  # fmt: skip
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


def section(rows: Sequence[Row], lat: Latency, args: argparse.Namespace) -> str:
    ref = rows[0]
    lines = [
        START,
        "## Slurm",
        "",
        "Written by `make bench` (`python -m devtools.bench.slurm_bench`): one seed "
        f"(seed {args.seed}, gbs 256, max_steps {args.max_steps}) of `mlperf_grpo_run` with the "
        "toy jobs on the private Slurm (slurmctld and two slurmd nodes on this machine, "
        f"`devtools/servers/slurm_cluster.py`), training a {TRAIN_NODES}-node job (one JAX "
        f"process a node), an evaluation a {EVAL_NODES}-node job; each configuration on a "
        "fresh private Airflow. Not the benchmark's proportions: the toy's evaluation costs "
        "several of its training steps, not the seed's ~9; the rehearsal jobs, which have "
        "them, write a foreign evaluator's result, which the in-allocation evaluation cannot "
        "import yet.",
        "",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.machine()}, "
        f"nproc {os.cpu_count()}; load average at the end: "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg())
        + " (other work shared the machine)",
        "",
        "| schedule | W | passing step | time to verdict | ratio | node-minutes | ratio | "
        "Slurm jobs | evaluations | steps trained |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.label} | {r.window} | {r.passing_step} | {r.verdict_s:.0f} s | "
            f"{r.verdict_s / ref.verdict_s:.2f} | {r.node_s / 60:.1f} | "
            f"{r.node_s / ref.node_s:.2f} | {r.jobs} | {r.evaluations} | {r.steps_trained} |"
        )
    lines += [
        "",
        "- time to verdict: from the run's trigger to the latest `eval_stop` of the steps up to "
        "the passing one (the summaries then decide the run); ratio: over the reference's.",
        "- node-minutes: every Slurm job of the run, its run time (Slurm's start to end) x its "
        "nodes; the reference holds the training's nodes while it evaluates.",
        "- One run per configuration on a shared 2-core machine: the training's own time moved "
        "with the load (same steps trained in every row), so differences of a few tens of "
        "percent in node-minutes are not the schedule's alone; the order of time to verdict "
        "(during < after W=3 < reference) is what the schedules explain.",
        f"- Slurm's own latency over {len(lat.sbatch_s)} trivial jobs, one at a time, read every "
        f"0.05 s through `SlurmHook`: the sbatch call (with the hook's mkdir and first read) "
        f"{_med(lat.sbatch_s)}; submit to running {_med(lat.to_running_s)}; a job's last "
        f"write to the watch seeing it ended {_med(lat.end_seen_s)}.",
        END,
    ]
    return "\n".join(lines)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.bench.slurm_bench")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=10, help="trivial jobs for the latency")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "BENCHMARKS.md")
    parser.add_argument(
        "--poll-only", action="store_true", help="only the poll with 10,000 foreign jobs"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)  # so that `finally` stops what it started
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
                cluster, label, schedule, window, inside, seed=args.seed, max_steps=args.max_steps
            )
            rows.append(row)
        lat = latency(cluster, args.jobs)
    finally:
        cluster.cleanup()
    write_section(args.output, section(rows, lat, args), START, END)
    print(f"wrote the Slurm section of {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
