"""``make demo``: a whole open-division submission of three seeds through Airflow, on this machine.

Starts a private Airflow on 127.0.0.1 (SQLite, LocalExecutor, a local deployment: jobs are CPU
JAX subprocesses; ``--trainer toy``, the embedded default, runs the toy jobs, ``--trainer tunix``
Tunix's GRPO trainer and its evaluator, from ``docker/deployment.tunix.toml``, ``--trainer
rehearsal`` the rehearsal jobs at the benchmark's proportions scaled down, from
``docker/deployment.rehearsal.toml``), triggers
``mlperf_grpo_submission`` with the demo conf (outputs under ``runs/demo/``), prints the UI
address and login, follows the run (training steps, saved checkpoints, evaluated checkpoints,
task states), then prints the submission folder and the verdicts. ``--keep-running`` keeps
Airflow up afterwards until Ctrl-C; ``--ui-only`` (``make ui``) runs nothing and brings the
finished demo's Airflow (its home, ``.airflow/demo``) back up until Ctrl-C. ``--backend slurm``
(``make demo BACKEND=slurm``) runs the toy jobs on a private Slurm instead
(`devtools.servers.slurm_cluster`: slurmctld and two slurmd nodes on 127.0.0.1), the training
on both nodes, each evaluation on one; the progress lines name the Slurm jobs. Every process
``--executor celery`` (``make demo EXECUTOR=celery BACKEND=slurm``) runs it on the distributed
Airflow (`devtools.servers.distributed_airflow`: PostgreSQL, Redis, two schedulers, two Celery
workers each in a namespace of its own). Every process
it started is stopped by PID on the way out, also after a failure or Ctrl-C. Exit status 0
only when the submission passed every check (``--ui-only``: when Airflow came up).

    .venv/bin/python -m devtools.demo [--trainer toy|tunix|rehearsal] [--backend local|slurm]
        [--executor local|celery]
        [--global-batch-size N] [--max-steps N] [--seeds 1 2 3] [--keep-running | --ui-only]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.servers.airflow_server import (
    AirflowServerError,
    LocalAirflow,
    print_login,
    repo_config,
    wait_until_interrupted,
)
from rcpflow import recipe
from tasks.deployment import ENV_VAR, REPO_ROOT
from tasks.names import RUN_DAG_ID, SUBMISSION_DAG_ID

NAME = "demo"
HOME = REPO_ROOT / ".airflow" / "demo"
STORAGE_ROOT = REPO_ROOT / "runs"
# 2 cores: three trainings (or evaluations) at once keep them busy; the waits are deferred.
PARALLELISM = 4
TIMEOUT_S = 14 * 60
# On the private Slurm each training is two JAX processes: 12.6 min measured on 2 shared cores.
SLURM_TIMEOUT_S = 30 * 60
# The deployment of each --trainer; None: the embedded default (the toy jobs).
DEPLOYMENTS: dict[str, Path | None] = {
    "toy": None,
    "tunix": REPO_ROOT / "docker" / "deployment.tunix.toml",
    "rehearsal": REPO_ROOT / "docker" / "deployment.rehearsal.toml",
    "maxtext": REPO_ROOT / "docker" / "deployment.maxtext.toml",
}


# The private Slurm of --backend slurm: two nodes, CPUs declared (not detected) so that three
# 2-node trainings and the evaluations fit the queue at once.
SLURM_NODE_CPUS = 6
SLURM_EVAL_WINDOW = 2


def slurm_deployment(log_dir: Path, storage_root: Path = STORAGE_ROOT) -> str:
    """The deployment of --backend slurm: the toy jobs on the private Slurm (local transport),
    training on both nodes (one process each), evaluation on one."""
    return f"""
backend = "slurm"
storage_root = "{storage_root}"
eval_window = {SLURM_EVAL_WINDOW}
eval_schedule = "after_training"
train_timeout_minutes = 30
eval_timeout_minutes = 15

[slurm]
transport = "local"
working_dir = "{REPO_ROOT}"
log_dir = "{log_dir}"
python = "{sys.executable}"
poll_interval_s = 2.0
command_timeout_s = 30.0

[slurm.train]
nodes = 2
ntasks_per_node = 1
time_limit = "30"
signal_grace_s = 60
max_restarts = 1

[slurm.evaluate]
nodes = 1
time_limit = "15"
signal_grace_s = 30
max_restarts = 1

[jobs.train.env]
JAX_PLATFORMS = "cpu"

[jobs.evaluate.env]
JAX_PLATFORMS = "cpu"
"""


def demo_system(backend: str) -> dict[str, str]:
    """The system Param: on the private Slurm, this machine (both nodes are on it), named."""
    if backend != "slurm":
        return {}
    from rcpflow.submission.package import local_system

    facts = dataclasses.asdict(local_system(division="open"))
    fields = {k: v for k, v in facts.items() if isinstance(v, str) and k != "division"}
    return {**fields, "system_name": "private-slurm-2-nodes-on-one-host"}


def demo_conf(
    seeds: Sequence[int],
    global_batch_size: int,
    max_steps: int,
    backend: str = "local",
    storage_root: Path = STORAGE_ROOT,
) -> dict[str, Any]:
    return {
        "seeds": list(seeds),
        "global_batch_size": global_batch_size,
        "max_steps": max_steps,
        "val_start_at": None,
        "target": recipe.TARGET_ACCURACY,
        "division": "open",  # the toy policy uses its own learning rate
        "backend": backend,
        "storage_root": str(storage_root),
        "submission_name": NAME,
        "system": demo_system(backend),
    }


@dataclass
class Progress:
    """What has been printed so far, so each event is printed once."""

    started: float = field(default_factory=time.monotonic)
    train_step: dict[int, int] = field(default_factory=dict)
    checkpoints: dict[int, int] = field(default_factory=dict)
    evaluated: dict[int, set[int]] = field(default_factory=dict)
    task_states: dict[tuple[str, str, int], str] = field(default_factory=dict)
    slurm_jobs: dict[str, str] = field(default_factory=dict)  # job id -> last state printed
    log_offsets: dict[Path, int] = field(default_factory=dict)

    def say(self, text: str) -> None:
        elapsed = int(time.monotonic() - self.started)
        print(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {text}", flush=True)


def _run_dir(seed: int) -> Path:
    return STORAGE_ROOT / NAME / "runs" / f"seed_{seed}"


def _new_log_lines(progress: Progress, path: Path) -> list[str]:
    offset = progress.log_offsets.get(path, 0)
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return []
    end = data.rfind(b"\n") + 1  # only whole lines
    progress.log_offsets[path] = offset + end
    return data[:end].decode(errors="replace").splitlines()


def _training_lines(progress: Progress, seed: int) -> list[str]:
    """The trainer's own output lines, from the train job's task log files (the job's output
    as the watch shows it: ``<the job> | <line>``)."""
    folder = HOME / "logs" / f"dag_id={RUN_DAG_ID}" / f"run_id={NAME}__seed_{seed}"
    lines = []
    marker = " | "
    for path in sorted(folder.glob("task_id=train.job.run/**/*.log")):
        for raw in _new_log_lines(progress, path):
            try:
                event = str(json.loads(raw).get("event", ""))
            except ValueError:
                event = raw
            if marker in event:
                lines.append(event.split(marker, 1)[1])
    return lines


def follow_slurm(progress: Progress, seeds: Sequence[int]) -> None:
    """Print each Slurm job of the demo's runs when it appears and when its state changes
    (one squeue call)."""
    import subprocess

    from tasks.backends.slurm.adapter import job_name

    names = {}
    for seed in seeds:
        run_id = f"{NAME}__seed_{seed}"
        names[job_name(RUN_DAG_ID, run_id, "train")] = f"seed {seed}: training"
        for step in range(1, 200):
            names[job_name(RUN_DAG_ID, run_id, f"eval-{step}")] = f"seed {seed}: evaluation {step}"
    try:
        out = subprocess.run(
            ["squeue", "-h", "--states=all", "-o", "%i|%j|%T|%N"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return
    for line in out.splitlines():
        job_id, name, state, nodes = [*line.split("|"), "", "", ""][:4]
        if name in names and progress.slurm_jobs.get(job_id) != state:
            progress.slurm_jobs[job_id] = state
            where = f" on {nodes}" if nodes and state != "PENDING" else ""
            progress.say(f"{names[name]}: Slurm job {job_id} {state}{where}")


def _training_step(line: str) -> dict[str, Any] | None:
    """The trainers print one JSON object per update: step and timestamp_ms (the toy's also
    mean_reward and loss)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if (
        isinstance(record, dict)
        and isinstance(record.get("step"), int)
        and "timestamp_ms" in record
    ):
        return record
    return None


def follow_runs(progress: Progress, seeds: Sequence[int]) -> None:
    """Print new training steps, saved checkpoints and evaluated checkpoints per seed."""
    from rcpflow.files.layout import RunLayout
    from rcpflow.records.manifest import ManifestError, parse_rows
    from rcpflow.records.summary import SummaryError, read_summary

    for seed in seeds:
        for line in _training_lines(progress, seed):
            step = _training_step(line)
            if step is not None and step["step"] > progress.train_step.get(seed, 0):
                progress.train_step[seed] = step["step"]
                reward = step.get("mean_reward")  # the toy's; Tunix's job prints none
                progress.say(
                    f"seed {seed}: training step {step['step']}"
                    + ("" if reward is None else f", mean reward {reward:.3f}")
                )
        layout = RunLayout(str(_run_dir(seed)))
        try:
            rows = parse_rows(Path(layout.manifest).read_text(), layout.manifest)
        except (OSError, ManifestError):
            rows = []
        if rows and max(r.step for r in rows) > progress.checkpoints.get(seed, 0):
            last = max(r.step for r in rows)
            progress.checkpoints[seed] = last
            progress.say(f"seed {seed}: checkpoint of step {last} saved ({len(rows)} so far)")
        done = progress.evaluated.setdefault(seed, set())
        for row in sorted(rows, key=lambda r: r.step):
            if row.step in done or not Path(layout.summary(row.step)).exists():
                continue
            try:
                summary = read_summary(layout.summary(row.step))
            except (OSError, SummaryError):
                continue
            done.add(row.step)
            verdict = "PASSES" if summary.eval_accuracy > row.target_accuracy else "below"
            progress.say(
                f"seed {seed}: checkpoint {row.step} evaluated: pass@4 "
                f"{summary.eval_accuracy:.3f} ({verdict} target > {row.target_accuracy})"
            )


def _steps(seed: int) -> list[int]:
    """Manifest steps of a seed's run, in map-index order of its evaluate instances."""
    from rcpflow.files.layout import RunLayout
    from rcpflow.records.manifest import ManifestError, parse_rows

    path = RunLayout(str(_run_dir(seed))).manifest
    try:
        return sorted(r.step for r in parse_rows(Path(path).read_text(), path))
    except (OSError, ManifestError):
        return []


def follow_tasks(
    progress: Progress, airflow: LocalAirflow, dag_id: str, run_id: str, seed: int | None = None
) -> None:
    """Print task state changes of one DAG run; skipped evaluations as one line per poll."""
    where = "submission" if seed is None else f"seed {seed}"
    skipped: list[str] = []
    steps = _steps(seed) if seed is not None else []
    for ti in airflow.task_instances(dag_id, run_id):
        key = (run_id, ti["task_id"], ti["map_index"])
        state = ti["state"] or "none"
        if progress.task_states.get(key) == state:
            continue
        progress.task_states[key] = state
        task_id, index = ti["task_id"], ti["map_index"]
        label = task_id
        # the run DAG's per-step tasks (evaluation.checkpoint.*) and the deferred-eval DAG's
        evaluate = task_id in ("evaluation.evaluate", "evaluation.checkpoint.evaluate")
        if task_id.startswith("evaluation.checkpoint.") and not evaluate:
            if state in ("failed", "upstream_failed"):
                progress.say(f"{where}: {task_id}[{ti['rendered_map_index'] or index}] {state}")
            continue  # waits and stop checks: their steps are reported by the evaluations
        if index >= 0:
            if evaluate and index < len(steps):
                label = f"evaluate step {steps[index]}"
            else:
                label += f"[{ti['rendered_map_index'] or index}]"
        if evaluate:
            # evaluated checkpoints are reported from their summaries (follow_runs)
            if state == "skipped":
                skipped.append(label.removeprefix("evaluate step "))
            elif state in ("failed", "upstream_failed"):
                progress.say(f"{where}: {label} {state}")
            continue
        if state in ("running", "deferred", "success", "failed", "skipped", "upstream_failed"):
            progress.say(f"{where}: {label} {state}")
    if skipped:
        progress.say(
            f"{where}: evaluation of step(s) {', '.join(skipped)} skipped (a lower step passed)"
        )


def _use_deployment(trainer: str) -> None:
    deployment = DEPLOYMENTS[trainer]
    if deployment is None:
        os.environ.pop(ENV_VAR, None)  # the embedded default deployment
    else:
        os.environ[ENV_VAR] = str(deployment)  # the Airflow processes inherit it
    print(f"Trainer: {trainer} (deployment {deployment or 'embedded default'})")


def demo_airflow(executor: str = "local", shared: Sequence[Path] = ()) -> LocalAirflow:
    """The demo's local Airflow over its home (`HOME`), on a free port of 127.0.0.1; with
    ``executor="celery"`` the distributed one (`devtools.servers.distributed_airflow`), its
    workers sharing `shared` (what lies under /tmp of it) with the rest."""
    config = repo_config(HOME, parallelism=PARALLELISM)
    if executor != "celery":
        return LocalAirflow(config)
    from devtools.servers.distributed_airflow import DistributedAirflow, DistributedConfig

    return DistributedAirflow(DistributedConfig(config, shared=tuple(shared)))


def _keep_up(airflow: LocalAirflow) -> None:
    print()
    print_login(airflow)
    print(f"  outputs:     {STORAGE_ROOT / NAME}")
    print("Airflow stays up until Ctrl-C.", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        wait_until_interrupted(airflow)


def _stop(airflow: LocalAirflow, started: float) -> None:
    """Stop every process we started; what is printed around it cannot prevent that (a closed
    terminal or pipe makes print raise)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
    try:
        with contextlib.suppress(OSError):
            print("\nStopping Airflow ...", flush=True)
    finally:
        airflow.stop()
    minutes = (time.monotonic() - started) / 60
    print(f"Airflow stopped. Wall time: {minutes:.1f} min", flush=True)


def serve_ui(trainer: str) -> int:
    """``make ui``: the finished demo's Airflow, up until Ctrl-C; nothing is triggered."""
    started = time.monotonic()
    if not (HOME / "airflow.db").exists():
        print(f"error: {HOME}: no demo Airflow home here; run `make demo` first", file=sys.stderr)
        return 1
    _use_deployment(trainer)
    airflow = demo_airflow()
    print(f"Starting the demo's Airflow in {HOME} (SQLite, LocalExecutor)")
    try:
        airflow.start()
        _keep_up(airflow)
        return 0
    except AirflowServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        _stop(airflow, started)


@dataclass(frozen=True)
class DemoRequest:
    """What the demo was asked to run: the submission's seeds and sizes, which jobs, where."""

    seeds: tuple[int, ...]
    global_batch_size: int
    max_steps: int
    trainer: str
    keep_running: bool = False
    backend: str = "local"
    executor: str = "local"


def run_demo(request: DemoRequest) -> int:
    if request.backend == "slurm":
        return _on_private_slurm(request)
    if request.executor != "local":
        # the local backend runs its jobs as processes of the worker that starts them
        print(
            f"usage error: --executor {request.executor} needs --backend slurm (the local "
            "backend runs jobs on the worker's own host: docs/deploy.md)",
            file=sys.stderr,
        )
        return 2
    return _run_demo(request)


def _on_private_slurm(request: DemoRequest) -> int:
    """The demo with its jobs on a private Slurm, stopped by PID afterwards."""
    from devtools.servers.slurm_cluster import NodeSpec, SlurmCluster

    if request.trainer != "toy":
        print("error: --backend slurm runs the toy jobs (--trainer toy)", file=sys.stderr)
        return 2
    cluster = SlurmCluster((NodeSpec("n1", SLURM_NODE_CPUS), NodeSpec("n2", SLURM_NODE_CPUS)))
    print("Starting a private Slurm (slurmctld, slurmd n1 and n2 on 127.0.0.1) ...", flush=True)
    try:
        cluster.start()
        print(f"  SLURM_CONF={cluster.conf} (daemons {cluster.pids})", flush=True)
        os.environ.update(cluster.env)  # the Airflow processes submit through it
        return _run_demo(request, slurm_log_dir=cluster.root / "jobs")
    finally:
        print("Stopping the private Slurm (its jobs cancelled first) ...", flush=True)
        cluster.cleanup()


def _run_demo(request: DemoRequest, slurm_log_dir: Path | None = None) -> int:
    started = time.monotonic()
    for path in (HOME, STORAGE_ROOT / NAME):
        shutil.rmtree(path, ignore_errors=True)  # the demo's own folders: a clean run each time
    HOME.mkdir(parents=True)
    _use_deployment(request.trainer)
    shared: list[Path] = []
    if slurm_log_dir is not None:
        # beside the cluster's files, which every Celery worker shares (a worker's home is
        # its own)
        deployment = slurm_log_dir.parent / "deployment.slurm.toml"
        deployment.write_text(slurm_deployment(slurm_log_dir))
        os.environ[ENV_VAR] = str(deployment)
        shared.append(slurm_log_dir.parent)
        print(f"Backend: slurm (deployment {deployment})")
    airflow = demo_airflow(request.executor, shared)
    if request.executor == "celery":
        print(
            f"Starting a distributed Airflow in {HOME} (PostgreSQL, Redis, CeleryExecutor: two "
            "schedulers, two workers in namespaces of their own)"
        )
    else:
        print(f"Starting Airflow in {HOME} (SQLite, LocalExecutor, parallelism {PARALLELISM})")
    try:
        airflow.start()
        print()
        print_login(airflow)
        print(f"  outputs:     {STORAGE_ROOT / NAME}")
        print()
        airflow.ready(SUBMISSION_DAG_ID, RUN_DAG_ID)
        conf = demo_conf(
            request.seeds, request.global_batch_size, request.max_steps, request.backend
        )
        run_id = airflow.trigger(SUBMISSION_DAG_ID, conf, run_id=f"{NAME}__{int(time.time())}")
        print(f"Triggered {SUBMISSION_DAG_ID} run {run_id} with conf {json.dumps(conf)}")
        progress = Progress()

        def poll() -> None:
            if request.backend == "slurm":
                follow_slurm(progress, request.seeds)
            follow_runs(progress, request.seeds)
            follow_tasks(progress, airflow, SUBMISSION_DAG_ID, run_id)
            for seed in request.seeds:
                try:
                    follow_tasks(progress, airflow, RUN_DAG_ID, f"{NAME}__seed_{seed}", seed)
                except AirflowServerError:  # that run does not exist yet
                    continue

        timeout_s = SLURM_TIMEOUT_S if request.backend == "slurm" else TIMEOUT_S
        state = airflow.wait_for_run(SUBMISSION_DAG_ID, run_id, timeout_s, on_poll=poll)
        poll()
        print()
        report = STORAGE_ROOT / NAME / "report.md"
        print(f"Submission run: {state}")
        print(f"Submission folder: {STORAGE_ROOT / NAME / 'submission'}")
        print(f"Report: {report}")
        print()
        print(report.read_text() if report.exists() else "(no report was written)")
        if request.keep_running:
            _keep_up(airflow)
        return 0 if state == "success" else 1
    finally:
        _stop(airflow, started)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.demo",
        description=__doc__.splitlines()[0].replace("``", ""),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="one run per seed")
    parser.add_argument(
        "--global-batch-size",
        type=int,
        default=256,
        help="prompts x 16 generations per step; sets the validation start (18 at 256)",
    )
    parser.add_argument(
        "--max-steps", type=int, default=40, help="training steps at most, per seed"
    )
    parser.add_argument(
        "--trainer",
        choices=sorted(DEPLOYMENTS),
        default="toy",
        help="which jobs train and evaluate: toy (the embedded default), tunix (Tunix's GRPO "
        "trainer and evaluator), rehearsal (the rehearsal jobs, no JAX)",
    )
    parser.add_argument(
        "--backend",
        choices=("local", "slurm"),
        default="local",
        help="where the jobs run: local subprocesses, or a private Slurm on 127.0.0.1 (two "
        "slurmd nodes; the training on both)",
    )
    parser.add_argument(
        "--executor",
        choices=("local", "celery"),
        default="local",
        help="Airflow's executor: local (one host, SQLite) or celery (PostgreSQL, Redis, two "
        "schedulers and two Celery workers in namespaces of their own; needs --backend slurm)",
    )
    after = parser.add_mutually_exclusive_group()
    after.add_argument(
        "--keep-running",
        action="store_true",
        help="after the demo, keep Airflow up (address and login printed) until Ctrl-C",
    )
    after.add_argument(
        "--ui-only",
        action="store_true",
        help="run nothing: bring the finished demo's Airflow back up until Ctrl-C (make ui)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)  # so `finally` stops Airflow on kill too
    try:
        if args.ui_only:
            return serve_ui(args.trainer)
        return run_demo(
            DemoRequest(
                tuple(args.seeds),
                args.global_batch_size,
                args.max_steps,
                args.trainer,
                args.keep_running,
                args.backend,
                args.executor,
            )
        )
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
