"""Real job JSON of each Slurm version the harness runs, captured for the tests of the
product's readers (``tests/tasks/backends/slurm/fixtures/``): on a private cluster of
`devtools.servers.slurm_cluster`, one job per case (COMPLETED 0, FAILED 5, exit 143, killed by
SIGTERM, CANCELLED, held), each read through ``squeue --json``, ``scontrol --json show job``
and slurmrestd's ``GET /slurm/{api}/job/{id}`` (every API version it serves), trimmed to the
fields of a job the product reads or may read (identity, state, exit codes, times, output).

``python -m devtools.servers.slurm_capture --version 24.11 --out DIR`` writes
``DIR/slurm-24.11.json``.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devtools.servers.slurm_cluster import VERSIONS, SlurmCluster, SlurmClusterError

# case -> (sbatch options, the batch script's shell). "cancelled" is scancelled while it
# runs; "held" is submitted held and never runs.
CASES: dict[str, tuple[tuple[str, ...], str]] = {
    "completed_0": ((), "exit 0"),
    "failed_5": ((), "exit 5"),
    "exit_143": ((), "exit 143"),
    "killed_by_sigterm": ((), "kill -TERM $$"),
    "cancelled": ((), "sleep 300"),
    "held": (("--hold",), "true"),
}
# The job fields kept (the rest is scheduling detail no reader uses).
FIELDS = (
    "job_id",
    "name",
    "user_id",
    "user_name",
    "group_id",
    "account",
    "comment",
    "wckey",
    "job_state",
    "state_reason",
    "exit_code",
    "derived_exit_code",
    "submit_time",
    "start_time",
    "end_time",
    "time_limit",
    "restart_cnt",
    "standard_output",
    "standard_error",
    "current_working_directory",
    "nodes",
    "batch_host",
    "node_count",
)
_ENDED = ("COMPLETED", "FAILED", "CANCELLED")


def trim(job: dict[str, Any]) -> dict[str, Any]:
    return {key: job[key] for key in FIELDS if key in job}


def _state(cluster: SlurmCluster, job_id: str) -> str:
    line = cluster.client("scontrol", "show", "job", "-o", job_id)
    return line.split("JobState=", 1)[1].split()[0]


def _wait(cluster: SlurmCluster, job_id: str, states: Sequence[str]) -> None:
    deadline = time.monotonic() + 60
    while (state := _state(cluster, job_id)) not in states:
        if time.monotonic() > deadline:
            raise SlurmClusterError(f"job {job_id}: still {state}, not {'/'.join(states)}")
        time.sleep(0.2)


def submit_cases(cluster: SlurmCluster, folder: Path) -> dict[str, str]:
    """Each case's job, run to its state; case -> job id."""
    ids = {}
    for case, (options, shell) in CASES.items():
        out = cluster.client(
            "sbatch",
            "--parsable",
            f"--job-name=rcpflow-{case}",
            "-o",
            f"{folder}/%x-%j.out",
            *options,
            "--wrap",
            shell,
        )
        ids[case] = out.strip().split(";")[0]
    _wait(cluster, ids["cancelled"], ("RUNNING",))
    cluster.client("scancel", ids["cancelled"])
    for case, job_id in ids.items():
        if case != "held":
            _wait(cluster, job_id, _ENDED)
    return ids


def _rest_job(cluster: SlurmCluster, api: str, job_id: str, token: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{cluster.rest_url}/slurm/{api}/job/{job_id}",
        headers={"X-SLURM-USER-NAME": getpass.getuser(), "X-SLURM-USER-TOKEN": token},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        jobs: list[dict[str, Any]] = json.load(answer)["jobs"]
    return jobs[0]


def capture(cluster: SlurmCluster, folder: Path) -> dict[str, Any]:
    """Every case as each source gives it: {"slurm": version string, "sources": {source:
    {case: job}}}."""
    ids = submit_cases(cluster, folder)
    by_id = {job_id: case for case, job_id in ids.items()}
    # The hook's own form of squeue (one job, every state; 22.05 ignores both filters).
    sources: dict[str, dict[str, Any]] = {}
    sources["squeue"] = {}
    for case, job_id in ids.items():
        found = json.loads(cluster.client("squeue", "--json", "--states", "all", "--jobs", job_id))
        jobs = [j for j in found["jobs"] if str(j["job_id"]) == job_id]
        sources["squeue"][case] = trim(jobs[0])
    unavailable = {}
    try:
        sources["scontrol"] = {
            case: trim(
                json.loads(cluster.client("scontrol", "--json", "show", "job", job_id))["jobs"][0]
            )
            for job_id, case in by_id.items()
        }
    except SlurmClusterError as error:  # 22.05: "unrecognized option '--json'"
        unavailable["scontrol"] = str(error).strip().splitlines()[0]
    token = cluster.rest_token()
    for api in cluster.rest_api_versions():
        sources[f"rest-{api}"] = {
            case: trim(_rest_job(cluster, api, job_id, token)) for case, job_id in ids.items()
        }
    version = cluster.client("sinfo", "--version").strip()
    return {"slurm": version, "job_ids": ids, "sources": sources, "unavailable": unavailable}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.servers.slurm_capture",
        description="Capture real job JSON of one Slurm version (squeue, scontrol, slurmrestd).",
    )
    parser.add_argument("--version", choices=VERSIONS, required=True)
    parser.add_argument("--out", type=Path, required=True, help="folder for slurm-VERSION.json")
    args = parser.parse_args(argv)
    cluster = SlurmCluster(rest=True, version=args.version)
    try:
        with cluster:
            captured = capture(cluster, cluster.root / "jobs")
    except SlurmClusterError as error:
        print(f"slurm_capture: {error}", file=sys.stderr)
        return 1
    finally:
        cluster.cleanup()
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / f"slurm-{args.version}.json"
    target.write_text(json.dumps(captured, indent=1, sort_keys=True) + "\n")
    print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
