"""`JobState` (tasks.backend_api.job_state): every backend's read of a job maps into the one
type, and the watch loop says a state line in the task log once, when it changes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tasks.backend_api.job_state import JobState
from tasks.backends import local_adapter
from tasks.backends.gke.status import JobSetStatus
from tasks.backends.gke.triggers import JobSetTrigger
from tasks.backends.slurm.adapter import job_state
from tasks.backends.slurm.job_info import JobInfo


def _slurm(state: str, exit_code: int | None, restarts: int = 0, nodes: str = "n1") -> JobInfo:
    return JobInfo(
        "7", "n", state, "", exit_code, None, 5, 6, None, restarts, "", nodes, 600, "squeue"
    )


@pytest.mark.parametrize(
    ("read", "expected"),
    [
        (JobSetStatus("Running", progress="1/2 ready"), JobState(False, "Running [1/2 ready]")),
        (
            JobSetStatus("Failed", reason="BackoffLimit", message="pod x"),
            JobState(True, "Failed (BackoffLimit): pod x"),
        ),
        (JobSetStatus("Succeeded").job_state(), JobState(True, "Succeeded")),
        (_slurm("RUNNING", None, restarts=1), JobState(False, "RUNNING on n1, Slurm restart 1")),
        (_slurm("PENDING", None, nodes=""), JobState(False, "PENDING on (no nodes yet)")),
        (_slurm("FAILED", 3), JobState(True, "FAILED on n1", exit_code=3)),
        (local_adapter.RUNNING, JobState(False, "running")),
        (local_adapter.ended(0), JobState(True, "exited with status 0", exit_code=0)),
        (local_adapter.ended(-9), JobState(True, "ended by signal SIGKILL", exit_code=-9)),
    ],
)
def test_every_backend_reads_into_the_one_job_state(read: object, expected: JobState) -> None:
    if isinstance(read, JobSetStatus):
        read = read.job_state()
    elif isinstance(read, JobInfo):
        read = job_state(read)
    assert read == expected


def test_the_watch_logs_a_state_line_once_until_it_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said: list[str] = []
    log = SimpleNamespace(info=lambda fmt, *args: said.append(fmt % args))
    monkeypatch.setattr(JobSetTrigger, "log", property(lambda self: log))
    trigger = JobSetTrigger(name="j", namespace="ns", cluster={})
    for line in ("Running", "Running", "Failed", "Running"):
        trigger.log_state("here", JobState(ended=False, line=line))
    assert said == ["here: Running", "here: Failed", "here: Running"]
    assert "_line" not in trigger.kwargs()  # the trigger's own, never a kwarg
