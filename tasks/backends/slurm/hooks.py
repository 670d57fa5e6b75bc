"""Slurm hooks: every call the Slurm backend makes to a cluster goes through these.

`SlurmHook` submits (sbatch), reads (squeue --json, then scontrol, then sacct), cancels
(scancel) and reads a job's output, by running the commands through a `Runner`: this machine
(`LocalRunner`) or a login node over SSH (`SshRunner`, the SSH provider's `SSHHook`).
`RestSlurmHook` does the same through slurmrestd (JWT; the newest API version of
`rest_api.SPOKEN`, v0.0.38 to v0.0.42, that the server serves). `AsyncSlurmHook`
wraps either for a trigger's event loop. A cluster that does not answer is `ClusterUnreachable`
(retry; never a reason to fail a running job), a job that Slurm no longer knows is
`JobForgotten`, an id that now names another job is `JobIdReused`, a job that is not the
submitting account's (or lacks rcpflow's comment) is `NotOurJob`.

Every read names one job (``scontrol show job -o <id>``, a name-filtered ``squeue``: 22.05's
``squeue --json`` ignores its filters), every answer is bounded (`MAX_ANSWER_BYTES`), and a
job's output file is the deployment's ``log_dir/<name>-<id>.out``, never the path the
cluster reports. The commands run with a minimal environment (`client_env`), never the
worker's. docs/slurm.md has the why.

Nothing here logs a script or an environment: a script holds no secret (`script`), but env
values stay out of task logs all the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shlex
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from tasks.backends.slurm.job_info import (
    SACCT_FIELDS,
    TERMINAL_STATES,
    ClusterUnreachable,
    JobForgotten,
    JobIdReused,
    JobInfo,
    NotOurJob,
    SlurmError,
    Source,
    SubmittedJob,
    exit_status,
    job_from_json,
    job_from_sacct,
    job_from_scontrol,
)
from tasks.backends.slurm.rest_api import SPOKEN, cancel_query, submit_body
from tasks.backends.slurm.script import (
    BatchJob,
    job_comment,
    output_file,
    render_script,
    sbatch_options,
)
from tasks.backends.slurm.settings import SlurmSettings

_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|"
    r"Communication connection failure|Zero Bytes were transmitted|Slurm backup controller",
    re.IGNORECASE,
)
_INVALID_JOB = re.compile(r"Invalid job id specified|Unable to find JobId", re.IGNORECASE)
_NO_ACCOUNTING = re.compile(r"accounting storage is disabled|slurmdbd", re.IGNORECASE)
_JOB_ID = re.compile(r"^([0-9]+)(;[^\s]*)?$")
_OUTPUT_CHUNK = 1 << 20  # at most this much of a job's output per read
# The most one cluster answer may hold (a job's record, the jobs of one name, a chunk of
# output); more is an error that says so, never a read that grows with the queue.
MAX_ANSWER_BYTES = 8 << 20
# What a Slurm client needs of the worker's environment (the cluster's config, where the
# commands are, who runs them, the locale): nothing else of it reaches sbatch, whose job would
# otherwise carry it (Airflow's secrets included) to the compute nodes.
CLIENT_ENV = ("PATH", "SLURM_CONF", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ")
# scancel's and slurmrestd's words for a job that has ended already (or was forgotten): a
# cancel of it is done, on every transport.
_ENDED_ALREADY = re.compile(r"already completing or completed|Invalid job id", re.IGNORECASE)


def client_env(
    extra: Sequence[str] = (), environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment a Slurm client runs with: `CLIENT_ENV` and the `extra` names (the
    deployment's ``export_env``) of `environ` (this process's), those set only."""
    source = os.environ if environ is None else environ
    return {name: source[name] for name in (*CLIENT_ENV, *extra) if name in source}


def _too_big(argv: Sequence[str]) -> SlurmError:
    return SlurmError(
        f"{argv[0]}: its answer exceeded {MAX_ANSWER_BYTES} bytes (rcpflow reads at most that "
        "much of one answer)"
    )


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
    """The commands on this machine, with `env` (default: `client_env()`, never the whole
    environment of this process); at most `MAX_ANSWER_BYTES` of stdout read."""

    env: Mapping[str, str] | None = None

    def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout_s: float
    ) -> CommandResult:
        env = client_env() if self.env is None else dict(self.env)
        timed_out = threading.Event()
        with tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    env=env,
                )
            except FileNotFoundError as exc:
                raise SlurmError(f"{argv[0]}: not installed on this machine") from exc

            def expire() -> None:
                timed_out.set()
                proc.kill()

            timer = threading.Timer(timeout_s, expire)
            timer.start()
            try:
                if stdin is not None and proc.stdin is not None:
                    try:
                        proc.stdin.write(stdin.encode())
                        proc.stdin.close()
                    except BrokenPipeError:
                        pass
                assert proc.stdout is not None
                out = proc.stdout.read(MAX_ANSWER_BYTES + 1)
                if len(out) > MAX_ANSWER_BYTES:
                    proc.kill()
                proc.stdout.close()
                code = proc.wait()
            finally:
                timer.cancel()
            if timed_out.is_set():
                raise ClusterUnreachable(f"{argv[0]}: no answer within {timeout_s:.0f} s")
            if len(out) > MAX_ANSWER_BYTES:
                raise _too_big(argv)
            err.seek(0)
            stderr = err.read(MAX_ANSWER_BYTES).decode(errors="replace")
        return CommandResult(code, out.decode(errors="replace"), stderr)


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
                raw = chan_out.read(MAX_ANSWER_BYTES + 1)
                if len(raw) > MAX_ANSWER_BYTES:
                    raise _too_big(argv)
                err = chan_err.read(MAX_ANSWER_BYTES).decode(errors="replace")
                code = chan_out.channel.recv_exit_status()
        except SlurmError:
            raise
        except Exception as exc:  # paramiko, socket and the hook's own errors alike
            raise ClusterUnreachable(
                f"ssh {self.ssh_conn_id}: {argv[0]}: {type(exc).__name__}: {exc}"
            ) from exc
        return CommandResult(code, raw.decode(errors="replace"), err)


class _OwnJobs:
    """What both hooks share: which jobs are rcpflow's (`refusal`), and a job's output path."""

    settings: SlurmSettings

    def account(self) -> str:
        raise NotImplementedError

    def _placed(self, info: JobInfo) -> JobInfo:
        """`info` with the output path rcpflow gave the job (never the one Slurm reports: a
        job of another user could name any file)."""
        path = output_file(self.settings.log_dir, info.name, info.job_id)
        return dataclasses.replace(info, stdout_path=path)

    def refusal(self, info: JobInfo) -> str | None:
        """Why the job `info` is not rcpflow's to adopt, watch, cancel or read (None: it is):
        another account's, or without the comment rcpflow submits its jobs with."""
        account = self.account()
        where = f"Slurm job {info.job_id} ({info.name})"
        if info.user != account:
            return (
                f"{where} belongs to {info.user or 'an unknown user'!r}, not rcpflow's account "
                f"{account!r}: not ours, left alone"
            )
        # sacct keeps a comment only with AccountingStoreFlags=job_comment: its user decides.
        if info.comment != job_comment(info.name) and not (
            info.source == "sacct" and not info.comment
        ):
            return f"{where} lacks rcpflow's comment: not submitted by rcpflow, left alone"
        return None

    def _checked(self, info: JobInfo, expected: SubmittedJob | None) -> JobInfo:
        if expected is not None:
            info.check_identity(expected)
            why = self.refusal(info)
            if why is not None:
                raise NotOurJob(why)
        return self._placed(info)


class SlurmHook(_OwnJobs):
    """A Slurm cluster through its client commands, run by `runner` (from `settings` when
    not given: this machine, or the login node of ``ssh_conn_id``)."""

    def __init__(self, settings: SlurmSettings, runner: Runner | None = None) -> None:
        self.settings = settings
        if runner is None:
            runner = (
                SshRunner(settings.ssh_conn_id)
                if settings.transport == "ssh"
                else LocalRunner(client_env(settings.export_env))
            )
        self.runner = runner
        self.accounting: bool | None = None  # unknown until sacct was asked once
        self._account: str | None = None

    def account(self) -> str:
        """The user the commands run as (``id -un`` where they run): its jobs are rcpflow's."""
        if self._account is None:
            result = self._run("id", "-un")
            if result.returncode != 0 or not result.stdout.strip():
                raise SlurmError(f"id -un: {result.stderr.strip()}")
            self._account = result.stdout.strip()
        return self._account

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
        """The job's state: scontrol, else (forgotten there) sacct; JobForgotten when none
        knows it, JobIdReused when it is not `expected`, NotOurJob when it is not rcpflow's."""
        info = self._live_job(job_id)
        if info is None:
            info = self._accounted_job(job_id)
        if info is None:
            raise JobForgotten(
                f"Slurm job {job_id}: unknown to slurmctld (a finished job is kept MinJobAge "
                "seconds) and the cluster has no accounting (sacct)"
            )
        return self._checked(info, expected)

    def _live_job(self, job_id: str) -> JobInfo | None:
        """The job as slurmctld knows it: ``scontrol show job -o <id>`` reads that one job on
        every Slurm version (22.05's ``squeue --json`` answers the whole queue, whatever its
        filters)."""
        result = self._run("scontrol", "show", "job", "-o", job_id)
        if result.returncode != 0:
            if _INVALID_JOB.search(result.stderr):
                return None
            raise SlurmError(f"scontrol show job {job_id}: {result.stderr.strip()}")
        lines = [x for x in result.stdout.splitlines() if x.startswith(f"JobId={job_id} ")]
        return job_from_scontrol(lines[0]) if lines else None

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
        if result.returncode != 0 and not _ENDED_ALREADY.search(result.stderr):
            raise SlurmError(f"scancel {job_id}: {result.stderr.strip()}")

    def find_jobs(self, name: str) -> list[JobInfo]:
        """The jobs slurmctld knows by `name`, whoever owns them (`refusal` tells rcpflow's):
        their ids from a name-filtered ``squeue`` (text: it filters on every version), then
        each one's record."""
        result = self._run("squeue", "--noheader", "--states=all", f"--name={name}", "--format=%i")
        if result.returncode != 0:
            raise SlurmError(f"squeue --name {name}: {result.stderr.strip()}")
        found = [
            self._live_job(line.strip()) for line in result.stdout.splitlines() if line.strip()
        ]
        return _in_order([self._placed(j) for j in found if j is not None and j.name == name])

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

    def read_tail(self, path: str, size: int) -> str:
        """The last `size` bytes of the job's output file (at most 1 MiB); "" when it is not
        there."""
        size = min(size, _OUTPUT_CHUNK)
        result = self._run("sh", "-c", 'tail -c "$1" -- "$2"', "rcpflow", str(size), path)
        return result.stdout if result.returncode == 0 else ""


# slurmrestd's word for an id slurmctld does not know (every version). Not the CLI's "Unable to
# find JobId": 22.05's slurmrestd says that of a job it could not read for a token slurmctld
# refused ("Unspecified error"), which is no forgotten job.
_REST_INVALID_JOB = re.compile(r"Invalid job id specified", re.IGNORECASE)


class _NotServed(SlurmError):
    """slurmrestd serves no such path (404 without a JSON answer): an API version it lacks."""


class RestSlurmHook(_OwnJobs):
    """The same as `SlurmHook`, through slurmrestd (JWT): the user name and JWT are the
    connection `rest_conn_id`'s login and password (`credentials` overrides them). It speaks
    the newest API version of `rest_api.SPOKEN` that the server serves (`api`: asked once,
    then kept; `api=` given pins one). Reading a job's output needs the log folder on this
    machine too (a shared file system)."""

    def __init__(
        self,
        settings: SlurmSettings,
        credentials: tuple[str, str] | None = None,
        api: str | None = None,
    ) -> None:
        self.settings = settings
        self._credentials = credentials
        self._api = api
        self.accounting: bool | None = False

    def _user_and_token(self) -> tuple[str, str]:
        if self._credentials is None:
            from airflow.sdk import Connection

            conn = Connection.get(self.settings.rest_conn_id)
            self._credentials = (conn.login or "", conn.password or "")
        return self._credentials

    def account(self) -> str:
        """The user slurmrestd acts as: its jobs are rcpflow's."""
        return self._user_and_token()[0]

    def api(self) -> str:
        """The API version this hook speaks to its slurmrestd: the newest of `SPOKEN` whose
        ``/ping`` the server answers (one call per version, newest first, until one does; 24.11
        answers the first), asked once per hook. SlurmError when it serves none of them."""
        if self._api is None:
            for version in SPOKEN:
                try:
                    self._call("GET", "/ping", api=version)
                except _NotServed:
                    continue
                self._api = version
                break
            else:
                raise SlurmError(
                    f"slurmrestd at {self.settings.rest_url} serves none of the API versions "
                    f"rcpflow speaks ({', '.join(SPOKEN)})"
                )
        return self._api

    def _headers(self) -> dict[str, str]:
        user, token = self._user_and_token()
        return {
            "X-SLURM-USER-NAME": user,
            "X-SLURM-USER-TOKEN": token,
            "Content-Type": "application/json",
        }

    def _call(
        self, method: str, path: str, body: object = None, api: str | None = None
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        version = api or self.api()
        request = urllib.request.Request(
            f"{self.settings.rest_url.rstrip('/')}/slurm/{version}{path}",
            data=data,
            method=method,
            headers=self._headers(),
        )
        where = f"slurmrestd {method} /slurm/{version}{path}"
        try:
            with urllib.request.urlopen(request, timeout=self.settings.command_timeout_s) as r:
                raw = r.read(MAX_ANSWER_BYTES + 1)
                if len(raw) > MAX_ANSWER_BYTES:
                    raise _too_big([where])
                answer: dict[str, Any] = json.loads(raw or b"{}")
        except urllib.error.HTTPError as exc:
            text = exc.read(MAX_ANSWER_BYTES).decode(errors="replace")
            try:
                answer = json.loads(text)
            except ValueError:
                if exc.code >= 500:
                    raise ClusterUnreachable(f"{where}: {exc.code}") from exc
                if exc.code == 404:
                    raise _NotServed(f"{where}: not served: {text[:300]}") from exc
                raise SlurmError(f"{where}: {exc.code} {text[:300]}") from exc
        except (OSError, TimeoutError) as exc:
            raise ClusterUnreachable(f"{where}: {exc}") from exc
        errors = answer.get("errors") or []
        if errors:
            text = json.dumps(errors)
            if _REST_INVALID_JOB.search(text):
                answer["_invalid_job"] = True
            elif method == "DELETE" and _ENDED_ALREADY.search(text):
                answer["_ended"] = True  # a cancel of a job that ended: done, as scancel says
            elif _UNREACHABLE.search(text):
                raise ClusterUnreachable(f"{where}: {text}")
            else:
                raise SlurmError(f"{where}: {text}")
        return answer

    def ping(self) -> None:
        """ClusterUnreachable unless slurmctld answers slurmrestd (v0.0.40+ answers 200 and
        says DOWN, e.g. for a token slurmctld refuses)."""
        answer = self._call("GET", "/ping")
        for ping in answer.get("pings") or []:
            state = ping.get("pinged", ping.get("ping", "UP")) if isinstance(ping, dict) else "UP"
            if state != "UP":
                raise ClusterUnreachable(
                    f"slurmrestd at {self.settings.rest_url}: slurmctld {state} (or it refuses "
                    "this token)"
                )

    def submit(self, job: BatchJob) -> SubmittedJob:
        # slurmrestd takes the job's environment whole: PATH and the names the deployment
        # exports (`export_env`), nothing else of this worker's.
        exported = {n: os.environ[n] for n in job.export_env if n in os.environ}
        answer = self._call("POST", "/job/submit", submit_body(job, self.api(), exported))
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
                "seconds; slurmrestd's slurmctld API reads no accounting)"
            )
        return self._checked(job_from_json(jobs[0], "rest"), expected)

    def cancel(self, job_id: str, signal: str | None = None) -> None:
        """The job cancelled (with `signal`: only its batch shell signalled, on v0.0.38 the
        job); one that has ended already, or that Slurm forgot, is fine, as on the CLI."""
        self._call("DELETE", f"/job/{job_id}{cancel_query(self.api(), signal)}")

    def find_jobs(self, name: str) -> list[JobInfo]:
        """The jobs of `name`, whoever owns them (`refusal` tells rcpflow's). slurmrestd's
        ``/jobs`` has no name filter (v0.0.38 to v0.0.42): the whole queue, bounded by
        `MAX_ANSWER_BYTES`."""
        answer = self._call("GET", "/jobs")
        jobs = [job_from_json(j, "rest") for j in answer.get("jobs", []) if j.get("name") == name]
        return _in_order([self._placed(j) for j in jobs])

    def read_output(self, path: str, offset: int) -> tuple[str, int]:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(_OUTPUT_CHUNK)
        except OSError:
            return "", offset
        return data.decode(errors="replace"), offset + len(data)

    def read_tail(self, path: str, size: int) -> str:
        try:
            with open(path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - min(size, _OUTPUT_CHUNK)))
                data = f.read()
        except OSError:
            return ""
        return data.decode(errors="replace")


def _in_order(jobs: list[JobInfo]) -> list[JobInfo]:
    """Jobs oldest first (by id), as both hooks give them."""
    return sorted(jobs, key=lambda j: int(j.job_id) if j.job_id.isdigit() else 0)


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
    "TERMINAL_STATES",
    "AsyncSlurmHook",
    "BatchJob",
    "ClusterUnreachable",
    "JobForgotten",
    "JobIdReused",
    "JobInfo",
    "LocalRunner",
    "NotOurJob",
    "RestSlurmHook",
    "SlurmError",
    "SlurmHook",
    "Source",
    "SshRunner",
    "SubmittedJob",
    "exit_status",
    "job_from_json",
    "job_from_sacct",
    "job_from_scontrol",
    "sbatch_options",
    "slurm_hook",
]
