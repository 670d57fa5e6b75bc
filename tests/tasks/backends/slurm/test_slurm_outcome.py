"""`outcome.decide` against the job contract's table in docs/exit-codes.md (its Slurm column),
and Slurm's own end states."""

from __future__ import annotations

import pytest
from job_contract import documented_actions

from tasks.backends.slurm.hooks import JobInfo
from tasks.backends.slurm.outcome import decide

ACTIONS = {
    "success": "succeeded",
    "restart, counted": "restart_counted",
    "restart, not counted": "restart_uncounted",
    "fail at once": "fail_now",
}


def info(state: str, code: int | None, *, ran_s: int = 30, limit_s: int = 3600) -> JobInfo:
    return JobInfo(
        job_id="7", name="n", state=state, reason="", exit_code=code, signal=0, submit_time=1,
        start_time=1000, end_time=1000 + ran_s, restarts=0, stdout_path="", nodes="n1",
        time_limit_s=limit_s, source="squeue",
    )  # fmt: skip


def test_every_row_of_the_contract() -> None:
    contract = documented_actions("Slurm")
    assert set(contract) == {"0", "1", "2", "3", "4", "5", "143", "other"}
    for code, column in contract.items():
        for exit_code in [137, 134, 139, 9] if code == "other" else [int(code)]:
            state = "COMPLETED" if exit_code == 0 else "FAILED"
            got = decide(info(state, exit_code), (2, 5), 60, 3600).decision
            assert got == ACTIONS[column], (exit_code, column, got)


@pytest.mark.parametrize(
    ("state", "code", "ran_s", "decision", "words"),
    [
        ("PREEMPTED", 0, 30, "restart_uncounted", "not the job's fault"),
        ("NODE_FAIL", 0, 30, "restart_uncounted", "not the job's fault"),
        ("TIMEOUT", 0, 3600, "restart_counted", "time limit"),
        ("FAILED", 143, 3500, "restart_counted", "time limit's SIGTERM"),
        ("FAILED", 143, 100, "restart_uncounted", "preemption"),
        ("CANCELLED", 0, 30, "cancelled", "scancel"),
        ("OUT_OF_MEMORY", 0, 30, "restart_counted", "counted"),
    ],
)
def test_slurm_end_states(state: str, code: int, ran_s: int, decision: str, words: str) -> None:
    outcome = decide(info(state, code, ran_s=ran_s), (2, 5), 60, 3600)
    assert (outcome.decision, words in outcome.why) == (decision, True), outcome
