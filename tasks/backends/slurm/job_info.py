"""What Slurm says of a job, read from every shape it says it in: `JobInfo` (and
`SubmittedJob`, what identifies a job rcpflow submitted), the readers of ``squeue --json`` and
slurmrestd (openapi v0.0.38 to v0.0.42: plain numbers or ``{set, infinite, number}``, an
``exit_code`` that is a wait status or an object, a ``job_state`` string or list), of
``scontrol show job -o`` and of ``sacct``, and the errors a read ends in. Pure: the hooks
(`tasks.backends.slurm.hooks`) run the commands. docs/exit-codes.md has the shapes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

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


class SlurmError(RuntimeError):
    """A Slurm command failed for a reason of its own (refused options, no such partition)."""


class ClusterUnreachable(SlurmError):
    """slurmctld (or the login node, or slurmrestd) did not answer: try again later."""


class JobForgotten(SlurmError):
    """Slurm no longer knows the job (MinJobAge passed, no accounting)."""


class JobIdReused(SlurmError):
    """The job id now names another job (another name or submit time): the cluster's job
    ids were reset, or the state was lost."""


class NotOurJob(JobIdReused):
    """The job is another account's, or lacks rcpflow's comment: never adopted, watched,
    cancelled or read."""


@dataclass(frozen=True)
class SubmittedJob:
    """What identifies a submitted job: its id, name and submit time (epoch seconds)."""

    job_id: str
    name: str
    submit_time: int


@dataclass(frozen=True)
class JobInfo:
    """A job as Slurm reports it. `exit_code`/`signal` are the batch script's (None while it
    runs, or when Slurm's answer held none that could be read); `restarts` counts Slurm's own
    requeues; `user` and `comment` tell rcpflow's jobs from others'; `stdout_path` is the
    hook's own (`script.output_file`), never the cluster's."""

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
    user: str = ""
    comment: str = ""

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
    """A number of the openapi JSON: a plain int (v0.0.38), or v0.0.39+'s ``{"set",
    "infinite", "number"}`` (None when not set or infinite); None for anything else."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        return _int(value.get("number"))
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def exit_status(value: object) -> tuple[int | None, int | None]:
    """(exit code, signal) of a job's ``exit_code`` (or ``derived_exit_code``) in every
    openapi shape: a raw wait status (v0.0.38, 22.05), or v0.0.40+'s object
    ``{"status": [...], "return_code": {set, number}, "signal": {"id": {set, number},
    "name"}}``; (None, None) when it holds no code (not set, or status INVALID/PENDING)."""
    if isinstance(value, dict) and not {"status", "return_code", "signal"}.isdisjoint(value):
        status = value.get("status") or []
        if isinstance(status, str):
            status = [status]
        if any(s in ("INVALID", "PENDING") for s in status):
            return None, None
        code = _int(value.get("return_code"))
        signal = value.get("signal")
        sig = _int(signal.get("id")) if isinstance(signal, dict) else _int(signal)
        if code is None and sig is None:
            return None, None
        if code is None and "SIGNALED" in status:
            code = 0  # killed by the signal: no code of its own, as the wait status says
        return code, sig or 0
    raw = _int(value)
    if raw is None or raw < 0:
        return None, None
    return (raw >> 8) & 0xFF, raw & 0x7F


def _state(value: object) -> str:
    """A job's base state: v0.0.38's string, or v0.0.40+'s list of the state and its flags
    (``["FAILED"]``, ``["PENDING", "REQUEUED"]``): the first that is a base state."""
    if isinstance(value, list):
        names = [str(v) for v in value]
        known = [n for n in names if n in TERMINAL_STATES or n in _LIVE_STATES]
        return (known or names or [""])[0]
    return str(value or "")


_LIVE_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "REQUEUED"})


def job_from_json(job: Mapping[str, Any], source: Source) -> JobInfo:
    """A job object of ``squeue --json`` or slurmrestd's ``GET /job/{id}`` (openapi v0.0.38
    to v0.0.42: `exit_status`, `_state`, `_int` read each version's shape)."""
    state = _state(job.get("job_state", ""))
    finished = state in TERMINAL_STATES
    code, sig = exit_status(job.get("exit_code")) if finished else (None, None)
    start, end = _int(job.get("start_time")), _int(job.get("end_time"))
    limit = _int(job.get("time_limit"))
    return JobInfo(
        job_id=str(job.get("job_id", "")),
        name=str(job.get("name", "")),
        state=state,
        reason=str(job.get("state_reason", "")),
        exit_code=code,
        signal=sig,
        submit_time=_int(job.get("submit_time")) or 0,
        start_time=start or None,
        end_time=(end or None) if finished else None,
        restarts=_int(job.get("restart_cnt")) or 0,
        stdout_path="",
        nodes=str(job.get("nodes", "")),
        time_limit_s=None if limit is None or limit <= 0 else limit * 60,
        source=source,
        user=str(job.get("user_name", "")),
        comment=_comment(job.get("comment")),
    )


def _comment(value: object) -> str:
    """A job's comment: a string, or (sacct's v0.0.40+) ``{"job": ..., "administrator": ...}``."""
    if isinstance(value, dict):
        return str(value.get("job") or "")
    return str(value or "")


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
    """One ``scontrol show job -o`` line (``UserId=name(uid)``; ``Comment=`` when set)."""
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
        stdout_path="",
        nodes=f.get("NodeList", ""),
        time_limit_s=_duration_s(f.get("TimeLimit", "")),
        source="scontrol",
        user=f.get("UserId", "").split("(")[0],
        comment=f.get("Comment", ""),
    )


SACCT_FIELDS = (
    "JobID", "JobName", "State", "ExitCode", "Submit", "Start", "End", "Timelimit", "User",
    "Comment",
)  # fmt: skip


def job_from_sacct(line: str) -> JobInfo:
    """One ``sacct -X -n -P -o <SACCT_FIELDS>`` line (the allocation's own row)."""
    fields = line.split("|")
    job_id, name, state, exit_code, submit, start, end, limit = fields[:8]
    user, comment = [*fields[8:10], "", ""][:2]
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
        user=user,
        comment=comment,
    )
