"""slurmrestd's API versions as `RestSlurmHook` speaks them: which ones (`SPOKEN`, newest
first), and per version the body of a submit and the query of a cancel. Pure: the hook
(`tasks.backends.slurm.hooks`) asks the server which versions it serves and makes the calls;
the answers of every version are read by `tasks.backends.slurm.job_info`.

v0.0.38 is Slurm 22.05's (dropped in 23.11); v0.0.40 to v0.0.42 are 23.11's to 25.05's
(24.11 serves all three). They differ in the submit: v0.0.38 takes the script beside the job
and the environment as a mapping; v0.0.40+ the script inside the job, the environment as a
list of ``NAME=value``, numbers as ``{set, number}`` and flags as lists. slurmrestd reads no
``#SBATCH`` line of the script: the job's options go in as properties, the same ones
`script.sbatch_options` gives sbatch. docs/slurm-versions.md has the measured facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasks.backends.slurm.job_info import SlurmError
from tasks.backends.slurm.script import BatchJob, job_comment, render_script

# The versions rcpflow speaks, newest first: the hook takes the first the server serves.
SPOKEN = ("v0.0.42", "v0.0.41", "v0.0.40", "v0.0.38")
LEGACY = "v0.0.38"
# slurmrestd needs an environment; the script exports the job's own.
_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
# The job properties of v0.0.38 whose name is not the sbatch option's.
_LEGACY_NAMES = {"constraint": "constraints"}


def submit_body(job: BatchJob, version: str, exported: Mapping[str, str]) -> dict[str, Any]:
    """The body of ``POST /slurm/<version>/job/submit`` for `job`; `exported` is what of this
    worker's environment the deployment passes on (`BatchJob.export_env`): with PATH, the
    job's whole environment (slurmrestd takes it as given, as sbatch's ``--export`` does)."""
    environment = {"PATH": _PATH, **exported}
    if version == LEGACY:
        return {
            "script": render_script(job),
            "job": {**legacy_job_properties(job), "environment": environment},
        }
    props = job_description(job)
    props["environment"] = [f"{k}={v}" for k, v in environment.items()]
    return {"job": props}


def cancel_query(version: str, signal: str | None) -> str:
    """The query of ``DELETE /slurm/<version>/job/{id}``: none (cancel), or the signal sent to
    the batch shell only, as ``scancel --signal=S --batch``. v0.0.38 has no flags: 22.05 signals
    the whole job, srun included, which kills the step (rcpflow itself only cancels)."""
    if not signal:
        return ""
    if version == LEGACY:
        return f"?signal={signal}"
    return f"?signal={signal}&flags=BATCH_JOB"


def _no_extra_args(job: BatchJob) -> None:
    if job.shape.extra_sbatch_args:
        raise SlurmError(
            "extra_sbatch_args cannot be sent through slurmrestd (it takes job properties, "
            "not sbatch options): use transport 'local' or 'ssh'"
        )


def _time_limit_min(job: BatchJob) -> int:
    return -(-job.shape.time_limit_s // 60)


def _common(job: BatchJob) -> dict[str, Any]:
    """The properties every version names alike."""
    shape = job.shape
    return {
        "name": job.name,
        "comment": job_comment(job.name),
        "current_working_directory": job.working_dir,
        "standard_output": job.output_path,
        "standard_error": job.output_path,
        "tasks_per_node": shape.ntasks_per_node,
        "tasks": shape.tasks,
        "cpus_per_task": shape.cpus_per_task,
        "requeue": True,
    }


def legacy_job_properties(job: BatchJob) -> dict[str, Any]:
    """The v0.0.38 job properties of `job`, but its environment."""
    _no_extra_args(job)
    shape = job.shape
    props: dict[str, Any] = {
        **_common(job),
        "open_mode": "append",
        "nodes": [shape.nodes, shape.nodes],
        "time_limit": _time_limit_min(job),
        # slurmrestd 22.05 refuses "B:" ("Invalid SIGNAL specification"): the tasks get the
        # SIGTERM from Slurm directly, as the batch shell passes it on (`script`).
        "signal": f"TERM@{shape.signal_grace_s}",
    }
    for flag, value in shape.named_options():
        props[_LEGACY_NAMES.get(flag, flag)] = value
    if shape.gpus_per_node:
        props["gpus_per_node"] = str(shape.gpus_per_node)
    if shape.mem:
        props["memory_per_node"] = _megabytes(shape.mem)
    if shape.exclusive:
        props["exclusive"] = "exclusive"
    return props


def _number(value: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": value}


def job_description(job: BatchJob) -> dict[str, Any]:
    """The v0.0.40+ job description of `job` (the script inside), but its environment."""
    _no_extra_args(job)
    shape = job.shape
    props: dict[str, Any] = {
        **_common(job),
        "script": render_script(job),
        "open_mode": ["APPEND"],
        "minimum_nodes": shape.nodes,
        "maximum_nodes": shape.nodes,
        "time_limit": _number(_time_limit_min(job)),
        # sbatch's --signal=B:TERM@<grace>: the batch shell gets it and passes it on.
        "kill_warning_signal": "TERM",
        "kill_warning_delay": _number(shape.signal_grace_s),
        "kill_warning_flags": ["BATCH_JOB"],
    }
    tres: list[str] = []
    for flag, value in shape.named_options():
        if flag == "gres":  # sbatch's --gres=gpu:2 is the job's tres_per_node gres/gpu:2
            tres += [t if t.startswith("gres/") else f"gres/{t}" for t in value.split(",")]
        else:
            props[_LEGACY_NAMES.get(flag, flag)] = value
    if shape.gpus_per_node:
        tres.append(f"gres/gpu:{shape.gpus_per_node}")
    if tres:
        props["tres_per_node"] = ",".join(tres)
    if shape.mem:
        props["memory_per_node"] = _number(_megabytes(shape.mem))
    if shape.exclusive:
        props["shared"] = ["none"]  # what sbatch's --exclusive sets (v0.0.42 has no "exclusive")
    return props


def _megabytes(mem: str) -> int:
    units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    number, unit = (mem[:-1], mem[-1]) if mem[-1] in units else (mem, "M")
    return int(int(number) * units[unit])
