"""The process calls of the local driver (`tasks.backends.local.driver`): a job is a process
group on this machine, found by its run's identity, read by its exit status, cancelled by
signal. No Airflow here.

A job starts detached (its own session: it outlives the task process that started it, so a
task can defer while it runs and a retry adopts it) under a tiny wrapper (`_WRAPPER`) that
runs the job's argv, waits for it and writes its exit code to a file: the status survives the
worker. Its output (stdout and stderr) goes to a file beside that, which the watch copies into
the task log. The record of the job a DAG run's task started (`job.json` in the job's folder,
`job_folder`: one per DAG run, run folder and label) names the wrapper's PID with the process's
start time, so a PID some later process reused is never taken for the job.

The local backend is single-host: the worker that starts a job, the triggerer that watches it
and the teardown that cancels it must be on one machine (they share its processes and its
temp folder).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tasks.backend_api.job_state import JobState

# Where the jobs' folders are by default: this machine's temp folder (see the module doc).
DEFAULT_JOBS_ROOT = Path(tempfile.gettempdir()) / "rcpflow-jobs"
RECORD_NAME = "job.json"
# How long a cancel waits between SIGTERM and SIGKILL by default: the job's own SIGTERM handling
# (the trainer's: finish the step's checkpoint write) gets this much.
CANCEL_GRACE_S = 10.0
_TAIL_BYTES = 4000
# How the wrapper's line about a program that could not start begins (`_WRAPPER`).
_NOT_STARTED = "could not start "

# Runs the job (argv[2:]) and records its exit code in argv[1]; a negative code is the signal
# that ended it, 127 a job that could not start. It ignores a SIGTERM to its process group (the
# job answers it) so that it can still record how the job ended; a SIGKILL ends both.
_WRAPPER = """\
import os, signal, subprocess, sys
exit_path, argv = sys.argv[1], sys.argv[2:]
signal.signal(signal.SIGTERM, lambda *_: None)
try:
    code = subprocess.call(argv)
except OSError as exc:
    print(f"could not start {argv[0]!r}: {exc}", flush=True)
    code = 127
with open(exit_path + ".tmp", "w") as f:
    f.write(str(code))
os.replace(exit_path + ".tmp", exit_path)
"""


class LocalJobError(RuntimeError):
    """A job could not be started or its record not read; names the folder or file."""


@dataclass(frozen=True)
class LocalJob:
    """One started job: what its record and the lifecycle's reference keep (JSON)."""

    name: str
    pid: int  # the wrapper's, the leader of the job's process group
    start: int  # the wrapper's start time (`process_start_time`)
    output: str
    exit_path: str

    def ref(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_ref(cls, ref: Mapping[str, object]) -> LocalJob:
        return cls(
            name=str(ref["name"]),
            pid=int(str(ref["pid"])),
            start=int(str(ref["start"])),
            output=str(ref["output"]),
            exit_path=str(ref["exit_path"]),
        )


def ended(exit_code: int | None) -> JobState:
    """A job that has ended with `exit_code` (None: without the wrapper recording a code,
    killed with it or lost in a reboot): succeeded on 0, else failed (a retry of the task
    starts it again)."""
    if exit_code is None:
        line = "ended without an exit status (killed)"
    elif exit_code < 0:
        line = f"ended by signal {signal.Signals(-exit_code).name}"
    else:
        line = f"exited with status {exit_code}"
    return JobState(line, "succeeded" if exit_code == 0 else "failed", exit_code)


RUNNING = JobState("running")


def job_folder(root: str | Path, dag_id: str, run_id: str, run_dir: str, label: str) -> Path:
    """The folder of the job `label` (``train``, ``eval-12``) of one DAG run on one run folder:
    the same on every try (a retry adopts the job), different for every DAG run and run folder
    (two Airflow homes on one machine may reuse a run id)."""
    digest = hashlib.sha256(f"{dag_id}\0{run_id}\0{run_dir}".encode()).hexdigest()[:20]
    return Path(root) / digest / label


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), None
    when no such process lives (a zombie has ended: its exit is being collected)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # comm may hold spaces and parentheses
    return None if fields[0] == "Z" else int(fields[19])


def _alive(job: LocalJob) -> bool:
    return process_start_time(job.pid) == job.start


def recorded(folder: Path) -> LocalJob | None:
    """The job last started in `folder`, None when none was."""
    path = folder / RECORD_NAME
    try:
        return LocalJob.from_ref(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError) as exc:
        raise LocalJobError(f"{path}: not a job record: {exc}") from exc


def state(job: LocalJob) -> JobState:
    """Whether `job` still runs, else how it ended (the lifecycle's `JobState`)."""
    if _alive(job):  # first: a wrapper that ends now has written its code before it ended
        return RUNNING
    try:
        code = int(Path(job.exit_path).read_text())
    except (OSError, ValueError):
        return ended(None)
    if code == 127:  # the wrapper's own line says which program could not start, and why
        last = output_tail(job).strip().splitlines()[-1:]
        if last and last[0].startswith(_NOT_STARTED):
            return JobState(last[0], "failed", code)
    return ended(code)


def start(
    folder: Path, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
) -> LocalJob:
    """Start `argv` as the job `name` in `folder` (detached, see the module doc), with this
    process's environment plus `env`, and record it."""
    folder.mkdir(parents=True, exist_ok=True)
    nonce = str(time.time_ns())  # every start its own files: a retry never reads an old exit
    output, exit_path = folder / f"{nonce}.out", folder / f"{nonce}.exit"
    child_env = {**os.environ, **(env or {})}
    # The job's Python output must reach the file line by line, not in 8 KiB blocks at exit.
    child_env["PYTHONUNBUFFERED"] = "1"
    with open(output, "ab") as out:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _WRAPPER, str(exit_path), *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_env,
                start_new_session=True,
            )
        except OSError as exc:
            raise LocalJobError(f"{name}: could not start the job wrapper: {exc}") from exc
    # (a wrapper that ended at once has no start time: its exit file says how it ended)
    began = process_start_time(proc.pid)
    job = LocalJob(name, proc.pid, began if began is not None else -1, str(output), str(exit_path))
    record = folder / RECORD_NAME
    tmp = record.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(job.ref()))
    tmp.replace(record)
    return job


def running_job(folder: Path) -> LocalJob | None:
    """The job recorded in `folder` if it still runs (an earlier try's, to adopt)."""
    job = recorded(folder)
    return job if job is not None and _alive(job) else None


def start_or_adopt(
    folder: Path, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[LocalJob, bool]:
    """The job an earlier try left running in `folder` (adopted: True), else a new one."""
    found = running_job(folder)
    if found is not None:
        return found, True
    return start(folder, name, argv, env), False


def cancel(job: LocalJob, grace_s: float = CANCEL_GRACE_S) -> bool:
    """SIGTERM the job's process group, SIGKILL it `grace_s` later if it still runs; False when
    it had ended already (or its PID names another process now)."""
    if not _alive(job):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _alive(job) and time.monotonic() < deadline:
        time.sleep(0.1)
    # the group, not only the wrapper: a job that ignored SIGTERM must not outlive it
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if _alive(job) or _group_lives(job.pid):
            os.killpg(job.pid, signal.SIGKILL)
    return True


def cancel_running(folder: Path, grace_s: float = CANCEL_GRACE_S) -> bool:
    """Cancel the job recorded in `folder` if it still runs; whether one did."""
    job = running_job(folder)
    return job is not None and cancel(job, grace_s)


def remove_folder(job: LocalJob) -> bool:
    """Remove the folder of `job` once it has ended (its record, exit code and output: the
    task log has the output), and its DAG run's folder when nothing else is left in it; a
    job that still runs keeps it. Whether the folder went."""
    if _alive(job):
        return False
    folder = Path(job.output).parent
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        folder.parent.rmdir()  # only when empty: another job of the DAG run may be in it
    return not folder.exists()


def _group_lives(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def read_output(job: LocalJob, offset: int) -> tuple[list[str], int]:
    """The whole lines the job wrote to its output from byte `offset` on, and the offset after
    them (a partial last line is read next time)."""
    try:
        with open(job.output, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace").splitlines(), offset + end


def output_tail(job: LocalJob) -> str:
    """The last lines of the job's output, for a failure's message."""
    try:
        with open(job.output, "rb") as f:
            f.seek(max(0, os.path.getsize(job.output) - _TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError as exc:
        return f"(output {job.output} not read: {exc})"


def could_not_start(state: JobState) -> bool:
    """The job's program could not start, and `state`'s line names it and why (its output
    has nothing more to say)."""
    return state.line.startswith(_NOT_STARTED)
