"""The local driver (tasks.backends.local): a job is a detached process group whose exit status
survives the process that started it (`processes`), read, cancelled and described by
`LocalDriver` under the one lifecycle (the watch trigger, the run operator, the teardown: what
is specific to local jobs here; the shared steps in
tests/tasks/backend_api/test_driver_lifecycle.py). Real processes throughout."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred
from polling import wait_until

from tasks.backend_api.job_operator import RunJobOperator
from tasks.backend_api.job_state import JobState
from tasks.backend_api.lifecycle_names import ENDED, JOB_RECORD_KEY, WATCH_TRIGGER
from tasks.backend_api.teardown import CancelRecordedJobs
from tasks.backend_api.watch_trigger import WatchTrigger
from tasks.backends.local import processes as adapter
from tasks.backends.local.driver import LocalDriver
from tasks.backends.local.processes import LocalJob

PY = sys.executable
SLEEPER = [PY, "-c", "import time; print('sleeping', flush=True); time.sleep(120)"]
# Ignores SIGTERM: only the SIGKILL after the grace ends it.
STUBBORN = [
    PY, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True);"
    " time.sleep(120)",
]  # fmt: skip


def wait_for(condition: Any) -> None:
    wait_until(condition, 30.0)


def ended(job: LocalJob) -> JobState:
    wait_for(lambda: adapter.state(job).ended)
    return adapter.state(job)


def living_members(pgid: int) -> list[int]:
    """The processes of group `pgid` that have not ended (zombies have: this test process,
    their parent, has not collected them yet)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, NotADirectoryError):
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def output_of(job: LocalJob) -> list[str]:
    return adapter.read_output(job, 0)[0]


@pytest.mark.timeout(60)
def test_a_job_runs_detached_and_its_exit_status_and_output_outlive_it(tmp_path: Path) -> None:
    code = "import os, sys; print('step 1'); print('env', os.environ['X']); sys.exit(3)"
    job = adapter.start(tmp_path / "j", "bad job", [PY, "-c", code], {"X": "y"})
    assert os.getpgid(job.pid) == job.pid != os.getpgid(0)  # its own process group
    assert ended(job) == JobState("exited with status 3", "failed", 3)
    assert output_of(job) == ["step 1", "env y"]
    assert "step 1" in adapter.output_tail(job)
    assert adapter.state(job).line == "exited with status 3"
    ok = adapter.start(tmp_path / "j", "ok job", [PY, "-c", "print('fine')"])
    assert ended(ok).exit_code == 0 and output_of(ok) == ["fine"]
    assert adapter.recorded(tmp_path / "j") == ok  # the record names the latest start
    missing = adapter.start(tmp_path / "m", "missing", ["/nonexistent/python"])
    assert ended(missing).exit_code == 127
    assert "could not start '/nonexistent/python'" in adapter.output_tail(missing)
    # one line naming the program, for the task's error (no output tail after it)
    line = adapter.state(missing).line
    assert line.startswith("could not start '/nonexistent/python': ") and "\n" not in line


@pytest.mark.timeout(60)
def test_output_is_read_in_whole_lines_from_an_offset(tmp_path: Path) -> None:
    code = "import sys; sys.stdout.write('a\\nb\\npartial'); sys.stdout.flush()"
    job = adapter.start(tmp_path / "j", "j", [PY, "-c", code])
    ended(job)
    lines, offset = adapter.read_output(job, 0)
    assert lines == ["a", "b"] and offset == 4
    assert adapter.read_output(job, offset) == ([], offset)  # the partial line waits


@pytest.mark.timeout(60)
def test_cancel_terms_the_group_and_kills_what_ignores_it(tmp_path: Path) -> None:
    job = adapter.start(tmp_path / "a", "sleeper", SLEEPER)
    wait_for(lambda: output_of(job) == ["sleeping"])
    assert adapter.cancel(job, grace_s=10.0)
    # the wrapper outlived the job's SIGTERM and recorded how it ended
    assert ended(job) == adapter.ended(-signal.SIGTERM)
    assert ended(job).line == "ended by signal SIGTERM"
    assert not adapter.cancel(job)  # gone already
    stubborn = adapter.start(tmp_path / "b", "stubborn", STUBBORN)
    wait_for(lambda: output_of(stubborn) == ["up"])
    assert adapter.cancel(stubborn, grace_s=0.5)
    state = ended(stubborn)
    assert state.exit_code is None and "killed" in state.line
    wait_for(lambda: living_members(stubborn.pid) == [])  # nothing of its group is left


def test_a_reused_pid_is_never_taken_for_the_job(tmp_path: Path) -> None:
    # this test's own process, recorded with another start time: a later process on its PID
    me = adapter.process_start_time(os.getpid())
    assert me is not None
    job = LocalJob("old", os.getpid(), me + 1, str(tmp_path / "o"), str(tmp_path / "e"))
    assert adapter.state(job) == adapter.ended(None)
    assert not adapter.cancel(job)  # and not signalled: we are still here


def test_the_job_folder_is_one_per_dag_run_run_folder_and_label(tmp_path: Path) -> None:
    f = adapter.job_folder
    base = f(tmp_path, "d", "r", "/runs/a", "train")
    assert base == f(tmp_path, "d", "r", "/runs/a", "train")  # every try finds it
    assert base.name == "train"
    others = {
        f(tmp_path, "d2", "r", "/runs/a", "train"),
        f(tmp_path, "d", "r2", "/runs/a", "train"),
        f(tmp_path, "d", "r", "/runs/b", "train"),
        f(tmp_path, "d", "r", "/runs/a", "eval-3"),
    }
    assert base not in others and len(others) == 4


@pytest.mark.timeout(60)
def test_a_retry_adopts_the_job_of_a_worker_killed_right_after_starting_it(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "job"
    # the worker's task process: killed (SIGKILL) at the hook point right after the start
    worker = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from tasks.backends.local.processes import start
        start(Path({str(folder)!r}), "train seed 1", {SLEEPER!r})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    died = subprocess.run([PY, "-c", worker], check=False)
    assert died.returncode == -signal.SIGKILL
    job, adopted = adapter.start_or_adopt(folder, "train seed 1", ["/never/started"])
    assert adopted and job == adapter.recorded(folder)
    assert not adapter.state(job).ended  # the job outlived its worker
    wait_for(lambda: output_of(job) == ["sleeping"])  # (its wrapper now records a SIGTERM)
    assert adapter.cancel_running(folder)
    assert ended(job).exit_code == -signal.SIGTERM
    assert adapter.running_job(folder) is None
    fresh, adopted = adapter.start_or_adopt(folder, "train seed 1", [PY, "-c", "pass"])
    assert not adopted and fresh.pid != job.pid and ended(fresh).exit_code == 0


# ---- the trigger and the operators ------------------------------------------------------------


def _driver(tmp_path: Path) -> LocalDriver:
    return LocalDriver(python=PY, base_env={}, jobs_root=str(tmp_path / "jobs"),
                       poll_interval_s=0.05)  # fmt: skip


def _trigger(tmp_path: Path, job: LocalJob, **kwargs: Any) -> WatchTrigger:
    d = _driver(tmp_path)
    return WatchTrigger(driver=d.name, driver_args=d.args(), ref=job.ref(),
                        poll_interval_s=d.poll_interval_s, **kwargs)  # fmt: skip


async def _events(trigger: WatchTrigger) -> list[dict[str, Any]]:
    return [e.payload async for e in trigger.run()]


@pytest.mark.timeout(60)
def test_the_watch_copies_the_output_and_ends_with_the_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = "import time; print('line 1', flush=True); time.sleep(0.5); print('line 2'); exit(4)"
    job = adapter.start(tmp_path / "j", "evaluate step 3", [PY, "-c", code])
    trigger = _trigger(tmp_path, job)
    (event,) = asyncio.run(_events(trigger))
    logged = capsys.readouterr().out  # a trigger logs through structlog
    assert event["phase"] == ENDED and event["ref"] == job.ref()
    assert event["state"] == {"line": "exited with status 4", "outcome": "failed",
                              "exit_code": 4, "reason": "", "detail": []}  # fmt: skip
    assert "evaluate step 3 | line 1" in logged and "evaluate step 3 | line 2" in logged
    assert trigger.memo["output_offset"] == len(b"line 1\nline 2\n")  # kept in its kwargs
    assert trigger.kwargs()["memo"] == trigger.memo
    assert trigger.serialize()[0] == WATCH_TRIGGER  # pinned: Airflow stores it


@pytest.mark.timeout(60)
def test_a_stop_request_seen_just_before_the_job_ends_ends_the_watch_once(tmp_path: Path) -> None:
    """The trainer honours the stop request within a step: its job ends seconds after the watch
    sees the request. The sighting is no re-defer (a `WATCHING` event just before the job's end
    is what Airflow's deferral race fails the task for, docs/slurm.md): one event, the end."""
    from devtools.synthetic_run import make_run
    from rcpflow.verdict.stop_request import request_stop

    run = make_run(str(tmp_path / "run"), last_step=20, accuracies={18: 0.3, 19: 0.8})
    assert request_stop(run.run_dir) is not None
    job = adapter.start(tmp_path / "j", "train", [PY, "-c", "import time; time.sleep(1)"])
    trigger = _trigger(tmp_path, job, stop_run_dir=run.run_dir, stop_grace_s=600.0)
    (event,) = asyncio.run(_events(trigger))
    assert (event["phase"], event["state"]["exit_code"]) == (ENDED, 0)
    assert trigger.stop_seen is not None  # seen, in memory; a later re-defer would carry it


class _TI:
    task_id = "train.job.run"
    map_index = -1
    try_number = 1

    def __init__(self, xcoms: dict[str, Any] | None = None) -> None:
        self.pushed: dict[str, Any] = {}
        self.xcoms = xcoms or {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def xcom_pull(self, task_ids: str, key: str, **kwargs: Any) -> Any:
        return self.xcoms.get(key)


def _context(ti: _TI) -> Any:
    return {"ti": ti, "dag_run": SimpleNamespace(dag_id="d", run_id="r")}


def _operator(tmp_path: Path, argv: list[str]) -> RunJobOperator:
    return RunJobOperator(
        task_id="run", driver=_driver(tmp_path), role="train", label="train", argv=argv,
        env={"A": "1"}, run_dir=str(tmp_path / "run"),
    )  # fmt: skip


@pytest.mark.timeout(60)
def test_the_operator_starts_records_defers_and_ends_by_the_exit_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.backend_api import watch_trigger

    monkeypatch.setattr(watch_trigger, "SETTLE_S", 0.0)
    code = "import os; print('owner', os.environ['RCPFLOW_RUN_OWNER'], os.environ['A'])"
    op, ti = _operator(tmp_path, [PY, "-c", code]), _TI()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(_context(ti))
    trigger = deferred.value.trigger
    assert isinstance(trigger, WatchTrigger) and trigger.driver == "local"
    record = ti.pushed[JOB_RECORD_KEY]
    assert (record["cancel"], record["why"]) == (None, "running")  # the teardown's rule
    (event,) = asyncio.run(_events(trigger))
    assert op.execute_complete(_context(ti), event)["exit_code"] == 0
    assert ti.pushed[JOB_RECORD_KEY]["cancel"] is True
    job = LocalJob.from_ref(record)
    assert output_of(job) == ["owner airflow:d/r/train.job.run 1"]
    # a failing job fails the task (a retry starts it again), quoting its last output
    failing = _operator(tmp_path, [PY, "-c", "import sys; print('boom'); sys.exit(2)"])
    with pytest.raises(TaskDeferred) as deferred:
        failing.execute(_context(_TI()))
    (event,) = asyncio.run(_events(deferred.value.trigger))
    with pytest.raises(AirflowException, match="train: exited with status 2") as failed:
        failing.execute_complete(_context(ti), event)
    assert "boom" in str(failed.value)


@pytest.mark.timeout(60)
def test_the_teardown_removes_the_folders_of_the_ended_jobs(tmp_path: Path) -> None:
    """Marked failed while deferred: no process to call on_kill, the teardown cancels; then
    the ended job's folder goes (the system temp folder does not fill up)."""
    first, ti = _operator(tmp_path, SLEEPER), _TI()
    with pytest.raises(TaskDeferred):
        first.execute(_context(ti))
    recorded = ti.pushed[JOB_RECORD_KEY]
    teardown = CancelRecordedJobs(driver=_driver(tmp_path), run_task_id="run")
    done = teardown.execute(_context(_TI({JOB_RECORD_KEY: recorded})))
    assert done == [{"job": "train", "cancelled": True}]
    assert adapter.state(LocalJob.from_ref(recorded)).ended
    folder = Path(recorded["output"]).parent
    assert not folder.exists() and not folder.parent.exists()
    # ... and a job that ended is left alone
    again = teardown.execute(_context(_TI({JOB_RECORD_KEY: recorded})))
    assert again == [{"job": "train", "cancelled": False}]


@pytest.mark.timeout(60)
def test_a_program_that_cannot_start_fails_its_task_in_one_line_naming_it(tmp_path: Path) -> None:
    """On a worker (``dag.test()``) and on the triggerer alike: no output tail after it."""
    job = adapter.start(tmp_path / "m", "evaluate step 18", ["/nonexistent/evaluator"])
    state = ended(job)
    op = RunJobOperator(task_id="t", driver=_driver(tmp_path), role="evaluate", label="eval-18")
    with pytest.raises(AirflowException) as raised:
        op.job_ended(_context(_TI()), job.ref(), state, {})
    said = str(raised.value)
    assert said.startswith("evaluate step 18: could not start '/nonexistent/evaluator': ")
    assert "\n" not in said
    trigger = _trigger(tmp_path, job)
    outcome = trigger.job_outcome(trigger.event(ENDED, state=state))
    assert outcome is not None and outcome.ended == "failed" and outcome.line == said
