"""`JobState` (tasks.backend_api.job_state): every driver's read of a job maps into the one type,
which the watch trigger's event carries as JSON, and the watch says a state line in the task log
once, when it changes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tasks.backend_api.job_state import OUTCOMES, JobState
from tasks.backend_api.watch_trigger import WatchTrigger
from tasks.backends.local import processes
from tasks.backends.slurm.adapter import state_line
from tasks.backends.slurm.job_info import JobInfo


def _slurm(state: str, exit_code: int | None, restarts: int = 0, nodes: str = "n1") -> JobInfo:
    return JobInfo(
        "7", "n", state, "", exit_code, None, 5, 6, None, restarts, "", nodes, 600, "squeue"
    )


def test_an_event_carries_the_state_as_json_and_back() -> None:
    state = JobState(
        "failed (BackoffLimit)", "fail_now", 137, "BackoffLimit", ("failed pod p0",),
        output=("a line",), changed=True,
    )  # fmt: skip
    as_json = state.as_json()
    assert "output" not in as_json and "changed" not in as_json  # the task log had them
    back = JobState.from_json(as_json)
    assert back == JobState("failed (BackoffLimit)", "fail_now", 137, "BackoffLimit",
                            ("failed pod p0",))  # fmt: skip
    assert back.ended and not JobState("running").ended
    assert set(OUTCOMES) >= {"succeeded", "failed", "fail_now", "restart", "foreign", "lost"}


def test_an_outcome_nobody_wrote_is_refused() -> None:
    with pytest.raises(ValueError, match="not a job outcome: 'done'"):
        JobState.from_json({"line": "x", "outcome": "done"})


@pytest.mark.parametrize(
    ("read", "expected"),
    [
        (_slurm("RUNNING", None, restarts=1), "RUNNING on n1, Slurm restart 1"),
        (_slurm("PENDING", None, nodes=""), "PENDING on (no nodes yet)"),
    ],
)
def test_a_running_slurm_job_is_said_in_one_line(read: JobInfo, expected: str) -> None:
    assert state_line(read) == expected


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (processes.RUNNING, JobState("running")),
        (processes.ended(0), JobState("exited with status 0", "succeeded", 0)),
        (processes.ended(3), JobState("exited with status 3", "failed", 3)),
        (processes.ended(-9), JobState("ended by signal SIGKILL", "failed", -9)),
        (processes.ended(None), JobState("ended without an exit status (killed)", "failed")),
    ],
)
def test_a_local_job_ends_succeeded_on_0_else_failed(state: JobState, expected: JobState) -> None:
    assert state == expected


def test_the_watch_logs_a_state_line_once_until_it_changes_and_every_output_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said: list[str] = []
    log = SimpleNamespace(info=lambda fmt, *args: said.append(fmt % args))
    monkeypatch.setattr(WatchTrigger, "log", property(lambda self: log))
    trigger = WatchTrigger(
        driver="local", driver_args={"jobs_root": "/x"}, ref={"name": "j"}, poll_interval_s=1
    )
    for line in ("Running", "Running", "Failed", "Running"):
        trigger.log_state("here", JobState(line, output=(f"out {line}",)))
    assert said == [
        "here | out Running", "here: Running", "here | out Running", "here | out Failed",
        "here: Failed", "here | out Running", "here: Running",
    ]  # fmt: skip
    assert "_line" not in trigger.kwargs()  # the trigger's own, never a kwarg
