"""Slurm hooks: every call the Slurm backend makes to a cluster goes through these.

`SlurmHook` submits (sbatch), reads (squeue --json, then scontrol, then sacct), cancels
(scancel) and reads a job's output, by running the commands through a `Runner`: this machine
(`LocalRunner`) or a login node over SSH (`SshRunner`, the SSH provider's `SSHHook`).
`RestSlurmHook` does the same through slurmrestd (openapi/v0.0.38, JWT). `AsyncSlurmHook`
wraps either for a trigger's event loop. A cluster that does not answer is `ClusterUnreachable`
(retry; never a reason to fail a running job), a job that Slurm no longer knows is
`JobForgotten`, an id that now names another job is `JobIdReused`.

Nothing here logs a script or an environment: a script holds no secret (`script`), but env
values stay out of task logs all the same.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeVar

from tasks.backends.slurm.script import BatchJob, render_script, sbatch_options
from tasks.backends.slurm.settings import SlurmSettings

# Job states (squeue/scontrol/sacct names). Terminal: the job will not run again by itself.
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "TIMEOUT",
        "CANCELLED",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
Source = Literal["squeue", "scontrol", "sacct", "rest"]
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|"
    r"Communication connection failure|Zero Bytes were transmitted|Slurm backup controller",
    re.IGNORECASE,
)
_INVALID_JOB = re.compile(r"Invalid job id specified|Unable to find JobId", re.IGNORECASE)
_NO_ACCOUNTING = re.compile(r"accounting storage is disabled|slurmdbd", re.IGNORECASE)
_JOB_ID = re.compile(r"^([0-9]+)(;[^\s]*)?$")
_OUTPUT_CHUNK = 1 << 20  # at most this much of a job's output per read


class SlurmError(RuntimeError):
    """A Slurm command failed for a reason of its own (refused options, no such partition)."""


class ClusterUnreachable(SlurmError):
    """slurmctld (or the login node, or slurmrestd) did not answer: try again later."""


class JobForgotten(SlurmError):
    """Slurm no longer knows the job (MinJobAge passed, no accounting)."""


class JobIdReused(SlurmError):
    """The job id now names another job (another name or submit time): the cluster's job
    ids were reset, or the state was lost."""


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    """Runs one Slurm client command; raises ClusterUnreachable when it cannot be run."""

    def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout_s: float
    ) -> CommandResult: ...


@dataclass(frozen=True)
class LocalRunner:
    """The commands on this machine, `env` added to this process's environment."""

    env: Mapping[str, str] | None = None

    def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout_s: float
    ) -> CommandResult:
        try:
            proc = subprocess.run(
                list(argv),
                input=stdin,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout_s,
                env={**os.environ, **(self.env or {})},
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterUnreachable(f"{argv[0]}: no answer within {timeout_s:.0f} s") from exc
        except FileNotFoundError as exc:
            raise SlurmError(f"{argv[0]}: not installed on this machine") from exc
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)


@dataclass(frozen=True)
class SshRunner:
    """The commands on a login node, through the SSH provider's hook for `ssh_conn_id` (one
    connection per command: a link that dropped is simply made again)."""

    ssh_conn_id: str

    def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout_s: float
    ) -> CommandResult:
        from airflow.providers.ssh.hooks.ssh import SSHHook

        command = shlex.join(argv)
        try:
            hook = SSHHook(ssh_conn_id=self.ssh_conn_id, conn_timeout=int(max(1, timeout_s)))
            with hook.get_conn() as client:
                chan_in, chan_out, chan_err = client.exec_command(command, timeout=timeout_s)
                if stdin is not None:
                    chan_in.write(stdin)
                chan_in.channel.shutdown_write()
                out = chan_out.read().decode(errors="replace")
                err = chan_err.read().decode(errors="replace")
                code = chan_out.channel.recv_exit_status()
        except Exception as exc:  # paramiko, socket and the hook's own errors alike
            raise ClusterUnreachable(
                f"ssh {self.ssh_conn_id}: {argv[0]}: {type(exc).__name__}: {exc}"
            ) from exc
        return CommandResult(code, out, err)


@dataclass(frozen=True)
class SubmittedJob:
    """What identifies a submitted job: its id, name and submit time (epoch seconds)."""

    job_id: str
    name: str
    submit_time: int


@dataclass(frozen=True)
class JobInfo:
    """A job as Slurm reports it. `exit_code`/`signal` are the batch script's (None while it
    runs); `restarts` counts Slurm's own requeues."""

    job_id: str
    name: str
    state: str
    reason: str
    exit_code: int | None
    signal: int | None
    submit_time: int
    start_time: int | None
    end_time: int | None
    restarts: int
    stdout_path: str
    nodes: str
    time_limit_s: int | None
    source: Source

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def run_time_s(self) -> int | None:
        if self.start_time is None or self.end_time is None:
            return None
        return max(0, self.end_time - self.start_time)

    def check_identity(self, expected: SubmittedJob) -> None:
        """JobIdReused unless this is the job that was submitted."""
        same_name = self.name == expected.name
        # Slurm keeps whole seconds; a requeue keeps the submit time.
        unknown = self.submit_time == 0 or expected.submit_time == 0
        same_time = unknown or abs(self.submit_time - expected.submit_time) <= 1
        if not (same_name and same_time):
            raise JobIdReused(
                f"Slurm job {self.job_id} is now {self.name!r} submitted at "
                f"{_iso(self.submit_time)}, not rcpflow's {expected.name!r} submitted at "
                f"{_iso(expected.submit_time)}: the cluster reused the id (its state was reset)"
            )


def _iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int(value: object) -> int | None:
    """A number of the openapi JSON (a plain int, or v0.0.39+'s {set, number})."""
    if isinstance(value, dict):
        return _int(value.get("number")) if value.get("set", True) else None
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _wait_status(raw: int | None) -> tuple[int | None, int | None]:
    """(exit code, signal) of a raw wait status as squeue --json gives it."""
    if raw is None:
        return None, None
    return (raw >> 8) & 0xFF, raw & 0x7F


def _expand(path: str, job: Mapping[str, Any]) -> str:
    """An output path's ``%j`` and ``%x`` (job id, name), as slurmd expands them."""
    return path.replace("%j", str(job.get("job_id", ""))).replace("%x", str(job.get("name", "")))


def job_from_json(job: Mapping[str, Any], source: Source) -> JobInfo:
    """A job object of ``squeue --json`` or slurmrestd's ``GET /job/{id}`` (openapi v0.0.38)."""
    state = job.get("job_state", "")
    if isinstance(state, list):  # later openapi versions: a list of flags
        state = state[0] if state else ""
    finished = str(state) in TERMINAL_STATES
    code, sig = _wait_status(_int(job.get("exit_code"))) if finished else (None, None)
    start, end = _int(job.get("start_time")), _int(job.get("end_time"))
    limit = _int(job.get("time_limit"))
    return JobInfo(
        job_id=str(job.get("job_id", "")),
        name=str(job.get("name", "")),
        state=str(state),
        reason=str(job.get("state_reason", "")),
        exit_code=code,
        signal=sig,
        submit_time=_int(job.get("submit_time")) or 0,
        start_time=start or None,
        end_time=(end or None) if finished else None,
        restarts=_int(job.get("restart_cnt")) or 0,
        stdout_path=_expand(str(job.get("standard_output", "")), job),
        nodes=str(job.get("nodes", "")),
        time_limit_s=None if limit is None or limit <= 0 else limit * 60,
        source=source,
    )


_SCONTROL_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z/:]*)=")


def _scontrol_fields(line: str) -> dict[str, str]:
    """``scontrol show job -o`` key=value pairs (a value runs to the next `` Key=``)."""
    matches = list(_SCONTROL_FIELD.finditer(line))
    fields: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields.setdefault(match.group(1), line[match.end() : end].strip())
    return fields


def _slurm_time(value: str) -> int | None:
    """Epoch seconds of Slurm's local ``YYYY-MM-DDTHH:MM:SS`` (None for Unknown/None)."""
    try:
        return int(datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").timestamp())
    except ValueError:
        return None


def _duration_s(value: str) -> int | None:
    """Seconds of Slurm's ``[D-]HH:MM:SS`` (None for UNLIMITED and the like)."""
    days, _, clock = value.rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or (days and not days.isdigit()):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


def _exit_pair(value: str) -> tuple[int | None, int | None]:
    code, _, sig = value.partition(":")
    return (int(code) if code.isdigit() else None, int(sig) if sig.isdigit() else None)


def job_from_scontrol(line: str) -> JobInfo:
    f = _scontrol_fields(line)
    state = f.get("JobState", "")
    finished = state in TERMINAL_STATES
    code, sig = _exit_pair(f.get("ExitCode", "")) if finished else (None, None)
    return JobInfo(
        job_id=f.get("JobId", ""),
        name=f.get("JobName", ""),
        state=state,
        reason=f.get("Reason", ""),
        exit_code=code,
        signal=sig,
        submit_time=_slurm_time(f.get("SubmitTime", "")) or 0,
        start_time=_slurm_time(f.get("StartTime", "")),
        end_time=_slurm_time(f.get("EndTime", "")) if finished else None,
        restarts=int(f.get("Restarts", "0") or 0),
        stdout_path=f.get("StdOut", ""),
        nodes=f.get("NodeList", ""),
        time_limit_s=_duration_s(f.get("TimeLimit", "")),
        source="scontrol",
    )


SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "Submit", "Start", "End", "Timelimit")


def job_from_sacct(line: str) -> JobInfo:
    """One ``sacct -X -n -P -o <SACCT_FIELDS>`` line (the allocation's own row)."""
    job_id, name, state, exit_code, submit, start, end, limit = line.split("|")[:8]
    state = state.split()[0] if state else ""  # "CANCELLED by 0"
    code, sig = _exit_pair(exit_code)
    return JobInfo(
        job_id=job_id,
        name=name,
        state=state,
        reason="",
        exit_code=code,
        signal=sig,
        submit_time=_slurm_time(submit) or 0,
        start_time=_slurm_time(start),
        end_time=_slurm_time(end),
        restarts=0,
        stdout_path="",
        nodes="",
        time_limit_s=_duration_s(limit),
        source="sacct",
    )


class SlurmHook:
    """A Slurm cluster through its client commands, run by `runner` (from `settings` when
    not given: this machine, or the login node of ``ssh_conn_id``)."""

    def __init__(self, settings: SlurmSettings, runner: Runner | None = None) -> None:
        self.settings = settings
        if runner is None:
            runner = (
                SshRunner(settings.ssh_conn_id) if settings.transport == "ssh" else LocalRunner()
            )
        self.runner = runner
        self.accounting: bool | None = None  # unknown until sacct was asked once

    def _run(self, *argv: str, stdin: str | None = None) -> CommandResult:
        result = self.runner.run(argv, stdin=stdin, timeout_s=self.settings.command_timeout_s)
        if result.returncode != 0 and _UNREACHABLE.search(result.stderr):
            raise ClusterUnreachable(f"{argv[0]}: {result.stderr.strip()}")
        return result

    def ping(self) -> None:
        """ClusterUnreachable unless slurmctld answers."""
        result = self._run("scontrol", "ping")
        if result.returncode != 0 or "UP" not in result.stdout:
            raise ClusterUnreachable(f"scontrol ping: {result.stdout.strip()} {result.stderr}")

    def submit(self, job: BatchJob) -> SubmittedJob:
        """sbatch the job (the script on stdin, after creating its log folder); its id. A
        refusal (bad partition, account, ...) is SlurmError with sbatch's own words."""
        made = self._run("mkdir", "-p", "--", job.log_dir, job.working_dir)
        if made.returncode != 0:
            raise SlurmError(f"mkdir {job.log_dir}: {made.stderr.strip()}")
        result = self._run("sbatch", "--parsable", stdin=render_script(job))
        found = _JOB_ID.fullmatch(result.stdout.strip())
        if result.returncode != 0 or not found:
            raise SlurmError(f"sbatch refused {job.name}: {result.stderr.strip()}")
        return SubmittedJob(found.group(1), job.name, _submit_time(self, found.group(1)))

    def job(self, job_id: str, expected: SubmittedJob | None = None) -> JobInfo:
        """The job's state: squeue --json, else scontrol, else (forgotten there) sacct;
        JobForgotten when none knows it, JobIdReused when it is not `expected`."""
        info = self._live_job(job_id)
        if info is None:
            info = self._accounted_job(job_id)
        if info is None:
            raise JobForgotten(
                f"Slurm job {job_id}: unknown to slurmctld (a finished job is kept MinJobAge "
                "seconds) and the cluster has no accounting (sacct)"
            )
        if expected is not None:
            info.check_identity(expected)
        return info

    def _live_job(self, job_id: str) -> JobInfo | None:
        result = self._run("squeue", "--json", "--jobs", job_id)
        if result.returncode == 0:
            try:
                found = json.loads(result.stdout)
            except ValueError:
                found = None
            if isinstance(found, dict):
                errors = found.get("errors") or []
                if errors:
                    text = json.dumps(errors)
                    if _UNREACHABLE.search(text) or "Failed" in text:
                        raise ClusterUnreachable(f"squeue: {text}")
                    raise SlurmError(f"squeue: {text}")
                jobs = [j for j in found.get("jobs", []) if str(j.get("job_id")) == job_id]
                return job_from_json(jobs[0], "squeue") if jobs else None
        # An older squeue without --json (or without its openapi plugin): scontrol's text.
        result = self._run("scontrol", "show", "job", "-o", job_id)
        if result.returncode != 0:
            if _INVALID_JOB.search(result.stderr):
                return None
            raise SlurmError(f"scontrol show job {job_id}: {result.stderr.strip()}")
        return job_from_scontrol(result.stdout.strip().splitlines()[0])

    def _accounted_job(self, job_id: str) -> JobInfo | None:
        if self.accounting is False:
            return None
        result = self._run("sacct", "-j", job_id, "-X", "-n", "-P", "-o", ",".join(SACCT_FIELDS))
        if result.returncode != 0:
            if _NO_ACCOUNTING.search(result.stderr):
                self.accounting = False
                return None
            raise SlurmError(f"sacct -j {job_id}: {result.stderr.strip()}")
        self.accounting = True
        rows = [line for line in result.stdout.splitlines() if line.split("|")[0] == job_id]
        return job_from_sacct(rows[-1]) if rows else None

    def cancel(self, job_id: str, signal: str | None = None) -> None:
        """scancel the job (with `signal`: only signal it, e.g. ``TERM``); one that has ended
        already is fine."""
        argv = ["scancel", *([f"--signal={signal}", "--batch"] if signal else []), job_id]
        result = self._run(*argv)
        if result.returncode != 0 and not re.search(
            r"already completing or completed|Invalid job id", result.stderr, re.IGNORECASE
        ):
            raise SlurmError(f"scancel {job_id}: {result.stderr.strip()}")

    def find_jobs(self, name: str) -> list[JobInfo]:
        """The jobs slurmctld knows by `name` (a task that retries adopts its running job)."""
        result = self._run("squeue", "--json", "--name", name, "--states", "all")
        if result.returncode != 0:
            raise SlurmError(f"squeue --name {name}: {result.stderr.strip()}")
        found = json.loads(result.stdout)
        return [job_from_json(j, "squeue") for j in found.get("jobs", []) if j.get("name") == name]

    def read_output(self, path: str, offset: int) -> tuple[str, int]:
        """The job's output file from byte `offset` (at most 1 MiB), and the offset after it;
        ("", offset) when the file is not there (yet)."""
        result = self._run(
            "sh",
            "-c",
            'tail -c +"$1" -- "$2" | head -c "$3"',
            "rcpflow",
            str(offset + 1),
            path,
            str(_OUTPUT_CHUNK),
        )
        if result.returncode != 0:
            return "", offset
        data = result.stdout
        return data, offset + len(data.encode())


class RestSlurmHook:
    """The same as `SlurmHook`, through slurmrestd (openapi/v0.0.38): the user name and JWT
    are the connection `rest_conn_id`'s login and password (`credentials` overrides them).
    Reading a job's output needs the log folder on this machine too (a shared file system)."""

    API = "/slurm/v0.0.38"

    def __init__(self, settings: SlurmSettings, credentials: tuple[str, str] | None = None) -> None:
        self.settings = settings
        self._credentials = credentials
        self.accounting: bool | None = False

    def _headers(self) -> dict[str, str]:
        if self._credentials is None:
            from airflow.sdk import Connection

            conn = Connection.get(self.settings.rest_conn_id)
            self._credentials = (conn.login or "", conn.password or "")
        user, token = self._credentials
        return {
            "X-SLURM-USER-NAME": user,
            "X-SLURM-USER-TOKEN": token,
            "Content-Type": "application/json",
        }

    def _call(self, method: str, path: str, body: object = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.settings.rest_url.rstrip("/") + self.API + path,
            data=data,
            method=method,
            headers=self._headers(),
        )
        try:
            with urllib.request.urlopen(request, timeout=self.settings.command_timeout_s) as r:
                answer: dict[str, Any] = json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                answer = json.loads(text)
            except ValueError:
                if exc.code >= 500:
                    raise ClusterUnreachable(f"slurmrestd {method} {path}: {exc.code}") from exc
                raise SlurmError(f"slurmrestd {method} {path}: {exc.code} {text[:300]}") from exc
        except (OSError, TimeoutError) as exc:
            raise ClusterUnreachable(f"slurmrestd {method} {path}: {exc}") from exc
        errors = answer.get("errors") or []
        if errors:
            text = json.dumps(errors)
            if _INVALID_JOB.search(text):
                answer["_invalid_job"] = True
            elif _UNREACHABLE.search(text):
                raise ClusterUnreachable(f"slurmrestd {method} {path}: {text}")
            else:
                raise SlurmError(f"slurmrestd {method} {path}: {text}")
        return answer

    def ping(self) -> None:
        self._call("GET", "/ping")

    def submit(self, job: BatchJob) -> SubmittedJob:
        body = {"script": render_script(job), "job": rest_job_properties(job)}
        answer = self._call("POST", "/job/submit", body)
        job_id = str(answer.get("job_id", ""))
        if not job_id.isdigit():
            raise SlurmError(f"slurmrestd submit of {job.name}: no job id in {answer}")
        return SubmittedJob(job_id, job.name, _submit_time(self, job_id))

    def job(self, job_id: str, expected: SubmittedJob | None = None) -> JobInfo:
        answer = self._call("GET", f"/job/{job_id}")
        jobs = [j for j in answer.get("jobs", []) if str(j.get("job_id")) == job_id]
        if not jobs:
            raise JobForgotten(
                f"Slurm job {job_id}: unknown to slurmctld (a finished job is kept MinJobAge "
                "seconds; slurmrestd's v0.0.38 API reads no accounting)"
            )
        info = job_from_json(jobs[0], "rest")
        if expected is not None:
            info.check_identity(expected)
        return info

    def cancel(self, job_id: str, signal: str | None = None) -> None:
        query = f"?signal={signal}" if signal else ""
        self._call("DELETE", f"/job/{job_id}{query}")

    def find_jobs(self, name: str) -> list[JobInfo]:
        answer = self._call("GET", "/jobs")
        return [job_from_json(j, "rest") for j in answer.get("jobs", []) if j.get("name") == name]

    def read_output(self, path: str, offset: int) -> tuple[str, int]:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(_OUTPUT_CHUNK)
        except OSError:
            return "", offset
        return data.decode(errors="replace"), offset + len(data)


def _submit_time(hook: SlurmHook | RestSlurmHook, job_id: str) -> int:
    """The submit time of a job just submitted, read back; 0 (unknown: the job is then told
    by its name alone) when the cluster does not answer now: a submitted job is never lost
    to a failed read."""
    for attempt in range(3):
        try:
            return hook.job(job_id).submit_time
        except ClusterUnreachable:
            time.sleep(1.0 + attempt)
    return 0


# The job properties of v0.0.38 whose name is not the sbatch option's.
_REST_NAMES = {"constraint": "constraints"}


def rest_job_properties(job: BatchJob) -> dict[str, Any]:
    """The v0.0.38 job properties of `job` (slurmrestd reads no ``#SBATCH`` line)."""
    shape = job.shape
    props: dict[str, Any] = {
        "name": job.name,
        "current_working_directory": job.working_dir,
        "standard_output": job.output_path,
        "standard_error": job.output_path,
        "open_mode": "append",
        "nodes": [shape.nodes, shape.nodes],
        "tasks_per_node": shape.ntasks_per_node,
        "tasks": shape.tasks,
        "cpus_per_task": shape.cpus_per_task,
        "time_limit": -(-shape.time_limit_s // 60),
        # slurmrestd 22.05 refuses "B:" ("Invalid SIGNAL specification"): the tasks get the
        # SIGTERM from Slurm directly, as the batch shell passes it on (`script`).
        "signal": f"TERM@{shape.signal_grace_s}",
        "requeue": True,
        # slurmrestd needs an environment; the script exports the job's own.
        "environment": {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"},
    }
    for flag, value in shape.named_options():
        props[_REST_NAMES.get(flag, flag)] = value
    if shape.gpus_per_node:
        props["gpus_per_node"] = str(shape.gpus_per_node)
    if shape.mem:
        props["memory_per_node"] = _megabytes(shape.mem)
    if shape.exclusive:
        props["exclusive"] = "exclusive"
    if shape.extra_sbatch_args:
        raise SlurmError(
            "extra_sbatch_args cannot be sent through slurmrestd (v0.0.38 takes job properties, "
            "not sbatch options): use transport 'local' or 'ssh'"
        )
    return props


def _megabytes(mem: str) -> int:
    units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    number, unit = (mem[:-1], mem[-1]) if mem[-1] in units else (mem, "M")
    return int(int(number) * units[unit])


AnyHook = SlurmHook | RestSlurmHook


def slurm_hook(settings: SlurmSettings) -> AnyHook:
    """The hook of the settings' transport."""
    if settings.transport == "rest":
        return RestSlurmHook(settings)
    return SlurmHook(settings)


T = TypeVar("T")


class AsyncSlurmHook:
    """Either hook from a trigger's event loop: each call in a thread (the commands, SSH and
    HTTP calls block), so that a slow cluster never stalls the triggerer."""

    def __init__(self, hook: AnyHook) -> None:
        self.hook = hook

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def job(self, job_id: str, expected: SubmittedJob | None = None) -> JobInfo:
        return await self._call(self.hook.job, job_id, expected)

    async def cancel(self, job_id: str, signal: str | None = None) -> None:
        await self._call(self.hook.cancel, job_id, signal)

    async def read_output(self, path: str, offset: int) -> tuple[str, int]:
        return await self._call(self.hook.read_output, path, offset)


__all__ = [
    "AsyncSlurmHook",
    "BatchJob",
    "ClusterUnreachable",
    "JobForgotten",
    "JobIdReused",
    "JobInfo",
    "LocalRunner",
    "RestSlurmHook",
    "SlurmError",
    "SlurmHook",
    "SshRunner",
    "SubmittedJob",
    "sbatch_options",
    "slurm_hook",
]
