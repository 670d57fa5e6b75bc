"""What the fixtures of this folder (conftest.py) hand a test, and what the tests ask of a run
folder and of Slurm."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.servers.distributed_airflow import DistributedAirflow
from devtools.servers.slurm_cluster import SlurmCluster
from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import parse_rows
from rcpflow.records.mllog import read_events
from tasks.backends.slurm.adapter import job_name

CLUSTER_QUEUE = "slurm-login"


@dataclass(frozen=True)
class Cluster:
    airflow: DistributedAirflow
    slurm: SlurmCluster
    storage: Path  # the deployment's storage_root, shared by every component
    hooks: Path  # the sbatch hook's folder (conftest.SBATCH_HOOK)


@dataclass(frozen=True)
class Submission:
    run_id: str
    state: str
    out_dir: Path
    runs: dict[int, str]  # seed -> run id of its mlperf_grpo_run

    def run_dir(self, seed: int) -> Path:
        return self.out_dir / "runs" / f"seed_{seed}"


def slurm_jobs(slurm: SlurmCluster, name: str) -> list[tuple[str, str]]:
    """(job id, state) of every job named `name` Slurm knows (finished ones included)."""
    out = slurm.client("squeue", "-h", "--states=all", "--name", name, "-o", "%i|%T")
    found = []
    for line in out.splitlines():
        job_id, _, state = line.partition("|")
        if job_id.strip():
            found.append((job_id.strip(), state.strip()))
    return found


def run_jobs(slurm: SlurmCluster, dag_id: str, run_id: str) -> dict[str, list[tuple[str, str]]]:
    """label (``train``, ``eval-12``) -> (job id, state) of every job of one DAG run that
    Slurm knows (finished ones included), told by the run's part of `job_name`."""
    head, _, tail = job_name(dag_id, run_id, "\0").partition("\0")
    found: dict[str, list[tuple[str, str]]] = {}
    for line in slurm.client("squeue", "-h", "--states=all", "-o", "%j|%i|%T").splitlines():
        name, job_id, state = (part.strip() for part in line.split("|"))
        if name.startswith(head) and name.endswith(tail):
            found.setdefault(name[len(head) : -len(tail)], []).append((job_id, state))
    return found


def deterministic_record(run_dir: Path, seed: int) -> dict[str, Any]:
    """What a run's outcome is, without its clocks: the MLLOG's eval events (step, accuracy),
    its run_stop (status, samples), the manifest's steps; timestamps and paths differ between
    two runs of one conf, these do not."""
    layout = RunLayout(str(run_dir))
    events = read_events(layout.mllog(seed))
    evals = [
        (e.metadata.get("epoch_num", e.metadata.get("step")), e.value)
        for e in events
        if e.key == "eval_accuracy"
    ]
    (stop,) = [e for e in events if e.key == "run_stop"]
    rows = parse_rows(Path(layout.manifest).read_text(), layout.manifest)
    return {
        "eval_accuracy": evals,
        "run_stop": {k: stop.metadata.get(k) for k in ("status", "samples_count")},
        "manifest_steps": [r.step for r in rows],
        "keys": json.dumps(sorted({e.key for e in events})),
    }
