"""What every cluster backend shares (tasks.backend_api): the exit-code contract as a retry
policy, the job rendering inputs with the run owner, the teardown rule."""

from __future__ import annotations

import pytest

from rcpflow.trainer import job_exit
from rcpflow.trainer.ownership import OWNER_ENV, airflow_owner
from tasks.backend_api.exit_policy import codes_deciding
from tasks.backend_api.job_inputs import with_run_owner
from tasks.backend_api.teardown import should_cancel


@pytest.mark.parametrize(
    ("code", "disrupted", "decision"),
    [
        (1, False, "restart_counted"),
        (2, False, "fail_now"),
        (3, False, "restart_counted"),
        (4, False, "restart_counted"),
        (5, False, "fail_now"),
        (137, False, "restart_counted"),
        (143, False, "restart_uncounted"),
        (5, True, "restart_uncounted"),  # a disrupted pod: whatever its code
        (1, True, "restart_uncounted"),
    ],
)
def test_restart_decision_follows_the_contract(code: int, disrupted: bool, decision: str) -> None:
    assert job_exit.restart_decision(code, disrupted=disrupted) == decision


def test_codes_deciding_lists_what_a_policy_renders() -> None:
    assert codes_deciding("fail_now", job_exit.DEFAULT_FAIL_EXIT_CODES) == [2, 5]
    assert codes_deciding("restart_uncounted", (2, 5, 7)) == [143]
    assert codes_deciding("fail_now", (7,)) == [7]
    assert 1 in codes_deciding("restart_counted", (2, 5))


@pytest.mark.parametrize(
    ("codes", "words"), [((1,), "uncaught"), ((143,), "SIGTERM"), ((0,), "1..255")]
)
def test_fail_exit_codes_problem(codes: tuple[int, ...], words: str) -> None:
    assert words in (job_exit.fail_exit_codes_problem(codes) or "")
    assert job_exit.fail_exit_codes_problem((2, 5, 7)) is None


def test_run_owner_is_added_to_the_env() -> None:
    env = with_run_owner({"A": "1"}, "dag", "run", "train.job")
    assert env == {"A": "1", OWNER_ENV: airflow_owner("dag", "run", "train.job")}


def test_teardown_cancels_what_no_task_decided() -> None:
    assert should_cancel({"name": "x"})[0] is True
    assert should_cancel({"name": "x", "cancel": None, "why": "running"})[0] is True
    assert should_cancel({"name": "x", "cancel": False, "why": "adopt"}) == (False, "adopt")
    assert should_cancel({"cancel": True, "why": "done"}) == (True, "done")
