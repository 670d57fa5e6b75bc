"""Slurm's JSON shapes, read the same whatever the version: ``exit_code`` as 22.05's raw wait
status (openapi v0.0.38) or v0.0.40+'s object, ``job_state`` a string or a list, numbers
plain or ``{set, infinite, number}``; and the contract's answer for each (a finished job whose
code cannot be read fails, never restarts). The v0.0.40-v0.0.42 shapes are Slurm's documented
PROCESS_EXIT_CODE_VERBOSE and *_NO_VAL structs (docs/exit-codes.md)."""

from __future__ import annotations

from typing import Any

import pytest

from tasks.backends.slurm.hooks import (
    exit_status,
    job_from_json,
    job_from_sacct,
    job_from_scontrol,
)
from tasks.backends.slurm.outcome import decide


def number(n: int, *, set_: bool = True, infinite: bool = False) -> dict[str, Any]:
    return {"set": set_, "infinite": infinite, "number": n}


def verbose(status: list[str], code: int | None, signal: int | None = None) -> dict[str, Any]:
    """v0.0.40+'s PROCESS_EXIT_CODE_VERBOSE."""
    return {
        "status": status,
        "return_code": number(code or 0, set_=code is not None),
        "signal": {
            "id": number(signal or 0, set_=signal is not None),
            "name": "" if signal is None else "SIG",
        },
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, (0, 0)),  # v0.0.38: a wait status
        (7 << 8, (7, 0)),
        (143 << 8, (143, 0)),
        (15, (0, 15)),  # killed by SIGTERM
        (number(5 << 8), (5, 0)),  # v0.0.39: the wait status in a struct
        (verbose(["SUCCESS"], 0), (0, 0)),
        (verbose(["ERROR"], 5), (5, 0)),
        (verbose(["ERROR"], 143), (143, 0)),
        (verbose(["SIGNALED"], None, 9), (0, 9)),
        (verbose(["SIGNALED", "CORE_DUMPED"], None, 11), (0, 11)),
        (verbose(["INVALID"], None), (None, None)),
        (verbose(["PENDING"], None), (None, None)),
        ({"status": ["ERROR"]}, (None, None)),  # no code in it
        (number(0, set_=False), (None, None)),
        (number(0, infinite=True), (None, None)),
        (None, (None, None)),
        ("0:0", (None, None)),
    ],
)
def test_exit_status_of_every_shape(value: object, expected: tuple[int | None, int | None]) -> None:
    assert exit_status(value) == expected


def v0041_job(state: Any, exit_code: Any, **more: Any) -> dict[str, Any]:
    """A job of ``squeue --json`` / slurmrestd on 24.11 (data_parser v0.0.41/42)."""
    return {
        "job_id": 42,
        "name": "rcpflow-train-abc",
        "user_name": "alice",
        "comment": "rcpflow:rcpflow-train-abc",
        "job_state": state,
        "state_reason": "None",
        "exit_code": exit_code,
        "derived_exit_code": verbose(["SUCCESS"], 0),
        "submit_time": number(1_700_000_000),
        "start_time": number(1_700_000_010),
        "end_time": number(1_700_000_070),
        "time_limit": number(60),
        "restart_cnt": 0,
        "nodes": "n1",
        "standard_output": "/etc/shadow",
        **more,
    }


@pytest.mark.parametrize(
    ("state", "exit_code", "decision"),
    [
        (["COMPLETED"], verbose(["SUCCESS"], 0), "succeeded"),
        (["FAILED"], verbose(["ERROR"], 5), "fail_now"),
        (["FAILED"], verbose(["ERROR"], 2), "fail_now"),
        (["FAILED"], verbose(["ERROR"], 1), "restart_counted"),
        (["FAILED"], verbose(["ERROR"], 143), "restart_uncounted"),  # SIGTERM, not the limit
        ("FAILED", 5 << 8, "fail_now"),  # 22.05's wait status
        ("COMPLETED", 0, "succeeded"),
    ],
)
def test_the_contract_reads_every_version(state: Any, exit_code: Any, decision: str) -> None:
    info = job_from_json(v0041_job(state, exit_code), "rest")
    assert decide(info, (2, 5), 60, 3600).decision == decision
    assert (info.submit_time, info.start_time, info.end_time) == (
        1_700_000_000,
        1_700_000_010,
        1_700_000_070,
    )
    assert (info.time_limit_s, info.user, info.comment) == (
        3600,
        "alice",
        "rcpflow:rcpflow-train-abc",
    )
    assert info.stdout_path == ""  # never the cluster's: the hook derives it


@pytest.mark.parametrize("exit_code", [verbose(["INVALID"], None), {}, None, "garbage"])
def test_a_finished_job_without_a_readable_code_fails_loudly(exit_code: Any) -> None:
    for state in (["COMPLETED"], ["FAILED"], "FAILED"):
        info = job_from_json(v0041_job(state, exit_code), "squeue")
        outcome = decide(info, (2, 5), 60, 3600)
        assert outcome.decision == "fail_now", outcome
        assert "held no exit code rcpflow can read" in outcome.why


@pytest.mark.parametrize(
    ("state", "base", "finished"),
    [
        (["PENDING", "REQUEUED"], "PENDING", False),
        (["RUNNING"], "RUNNING", False),
        (["COMPLETING", "COMPLETED"], "COMPLETING", False),
        (["CANCELLED"], "CANCELLED", True),
        (["NODE_FAIL", "REQUEUED"], "NODE_FAIL", True),
        ("TIMEOUT", "TIMEOUT", True),
        ([], "", False),
    ],
)
def test_job_state_a_string_or_a_list(state: Any, base: str, finished: bool) -> None:
    info = job_from_json(v0041_job(state, verbose(["SUCCESS"], 0)), "squeue")
    assert (info.state, info.finished) == (base, finished)


def test_an_unlimited_time_is_none_and_a_running_job_has_no_code() -> None:
    job = v0041_job(["RUNNING"], verbose(["PENDING"], None), time_limit=number(0, infinite=True))
    job["end_time"] = number(0, set_=False)
    info = job_from_json(job, "rest")
    assert (info.time_limit_s, info.end_time, info.exit_code, info.signal) == (
        None,
        None,
        None,
        None,
    )


def test_user_and_comment_of_the_text_forms() -> None:
    line = (
        "JobId=9 JobName=rcpflow-eval-3-abc UserId=mallory(1001) GroupId=root(0) "
        "JobState=PENDING Reason=JobHeldUser ExitCode=0:0 SubmitTime=2026-01-02T03:04:05 "
        "StartTime=Unknown EndTime=Unknown TimeLimit=01:00:00 Restarts=0 "
        "Comment=rcpflow:rcpflow-eval-3-abc StdOut=/home/airflow/secrets.env"
    )
    info = job_from_scontrol(line)
    assert (info.user, info.comment, info.stdout_path) == (
        "mallory",
        "rcpflow:rcpflow-eval-3-abc",
        "",
    )
    row = job_from_sacct("9|n|COMPLETED|0:0|Unknown|Unknown|Unknown|UNLIMITED|alice|c")
    assert (row.user, row.comment) == ("alice", "c")
