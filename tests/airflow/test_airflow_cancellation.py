"""Once a step passes, the evaluation jobs of higher steps still running are stopped (by signal
on the local backend) and their tasks end skipped naming the passing step; nothing at or below
the passing step is ever stopped, whichever evaluation finishes first.

The evaluations are the one evaluate operator (`EvaluateOperator`) holding the local driver,
driven as a task runner would: execute until it defers, its trigger until it fires, then
execute_complete. The jobs
are real processes (an interpreter wrapper that sleeps instead of evaluating); the decision
comes from the summaries on storage.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSkipException, TaskDeferred
from airflow_harness import PYTHON, write_deployment
from polling import wait_until

from devtools.synthetic_run import make_run
from tasks.backend_api import watch_trigger
from tasks.backend_api.lifecycle_names import eval_label
from tasks.backends.local import processes as local_adapter
from tasks.backends.local.driver import LocalDriver
from tasks.deployment import _load
from tasks.run.evaluate_operator import EvaluateOperator
from tasks.run.stages import cancel_above

# The passing step's job ends at once (its summary is the test's); every other one sleeps.
PASSING = 20


def sleeping_python(folder: Path) -> Path:
    """An interpreter whose evaluation jobs sleep (a long evaluation that never finishes),
    except the passing step's, which ends at once."""
    wrapper = folder / "python"
    wrapper.write_text(
        f"#!{PYTHON}\n"
        "import os, sys, time\n"
        "if sys.argv[1:3] == ['-m', 'tpu_jobs.evaluate']:\n"
        f"    if sys.argv[sys.argv.index('--step') + 1] != '{PASSING}':\n"
        "        time.sleep(120)\n"
        "    sys.exit(0)\n"
        f"os.execv({PYTHON!r}, [{PYTHON!r}, *sys.argv[1:]])\n"
    )
    wrapper.chmod(0o755)
    return wrapper


class _TI:
    map_index = -1
    task_id = "evaluation.checkpoint.evaluate"

    def xcom_push(self, key: str, value: Any) -> None:
        pass


@pytest.fixture(autouse=True)
def _no_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch_trigger, "SETTLE_S", 0.0)  # no scheduler here to race


CONTEXT: Any = {"ti": _TI(), "dag_run": SimpleNamespace(dag_id="d", run_id="r")}


class Evaluation(threading.Thread):
    """One evaluate task of the local backend: `begin` runs its execute (a job started, or an
    outcome at once); the thread then watches the job and completes: what it returned or
    raised is `outcome`."""

    def __init__(self, python: Path, jobs: Path, run_dir: str, step: int) -> None:
        super().__init__(daemon=True)
        deployment = _load(str(write_deployment(jobs.parent / "d.toml", str(python))))
        driver = LocalDriver(
            python=str(python), base_env={}, jobs_root=str(jobs), poll_interval_s=0.05
        )
        self.op = EvaluateOperator(
            task_id="evaluate", driver=driver, run_dir=run_dir, step=step,
            eval_job=deployment.jobs.evaluate,
        )  # fmt: skip
        self.outcome: Any = None
        self.trigger: Any = None

    def begin(self) -> None:
        try:
            self.outcome = self.op.execute(CONTEXT)
        except TaskDeferred as deferred:
            self.trigger = deferred.trigger
        except BaseException as exc:  # what the task would end with
            self.outcome = exc

    def run(self) -> None:
        async def first() -> Any:
            async for event in self.trigger.run():
                return event.payload

        try:
            self.outcome = self.op.execute_complete(CONTEXT, asyncio.run(first()))
        except BaseException as exc:
            self.outcome = exc


def running(jobs: Path, run_dir: str, step: int) -> int | None:
    """The PID of the step's evaluation job while it runs."""
    folder = local_adapter.job_folder(jobs, "d", "r", run_dir, eval_label(step))
    job = local_adapter.running_job(folder)
    return None if job is None else job.pid


@pytest.mark.timeout(300)
@pytest.mark.parametrize("passing_first", [True, False])
def test_a_pass_stops_the_running_higher_evaluations_and_nothing_below(
    tmp_path: Path, passing_first: bool
) -> None:
    # rows 18..24; step 20's summary passes once it is written; 19 (below) and 21, 22 (above)
    # are being evaluated by running jobs
    python, jobs = sleeping_python(tmp_path), tmp_path / "jobs"
    run = make_run(str(tmp_path / "run"), max_steps=24, accuracies={18: 0.3})
    evaluations = {s: Evaluation(python, jobs, run.run_dir, s) for s in (19, 21, 22)}
    for evaluation in evaluations.values():
        evaluation.begin()
        evaluation.start()
    wait_until(lambda: all(running(jobs, run.run_dir, s) for s in evaluations), 60.0)
    pids = {s: running(jobs, run.run_dir, s) for s in evaluations}

    if passing_first:
        # the passing step's own evaluation: its job ends having written the summary, and its
        # task stops the higher ones
        passed = Evaluation(python, jobs, run.run_dir, PASSING)
        passed.begin()
        assert passed.trigger is not None  # a job was started
        make_run(run.run_dir, max_steps=24, accuracies={18: 0.3, PASSING: 0.9})
        passed.run()
        assert passed.outcome["target_reached"] is True, passed.outcome
    else:
        # any order: the pass is read back from storage by a later check of the same run
        make_run(run.run_dir, max_steps=24, accuracies={18: 0.3, PASSING: 0.9})

        def cancel(run_dir: str, step: int) -> bool:
            folder = local_adapter.job_folder(jobs, "d", "r", run_dir, eval_label(step))
            return local_adapter.cancel_running(folder)

        assert cancel_above(run.run_dir, PASSING, cancel) == [21, 22]

    for step in (21, 22):
        evaluations[step].join(timeout=60)
        outcome = evaluations[step].outcome
        assert isinstance(outcome, AirflowSkipException), outcome
        assert str(outcome).startswith(f"step {step}: skipped, its evaluation was stopped: step 20")
        assert running(jobs, run.run_dir, step) is None
    # the step below the passing one is still being evaluated
    assert running(jobs, run.run_dir, 19) == pids[19]
    assert evaluations[19].is_alive()
    # and a stop asked for at or below the passing step is refused by cancel_above's rule
    assert cancel_above(run.run_dir, PASSING, lambda d, s: s <= PASSING) == []
    evaluations[19].op.driver.cancel_step("d", "r", run.run_dir, 19)  # clean up (our own job)
    evaluations[19].join(timeout=60)


@pytest.mark.timeout(120)
def test_a_higher_step_started_after_the_pass_launches_nothing(tmp_path: Path) -> None:
    python, jobs = sleeping_python(tmp_path), tmp_path / "jobs"
    run = make_run(str(tmp_path / "run"), max_steps=24, accuracies={18: 0.3, 19: 0.9})
    late = Evaluation(python, jobs, run.run_dir, 23)
    late.begin()
    assert late.trigger is None and isinstance(late.outcome, AirflowSkipException)
    assert str(late.outcome).startswith("step 23: skipped, not evaluated: step 19 already passed")
    folder = local_adapter.job_folder(jobs, "d", "r", run.run_dir, eval_label(23))
    assert local_adapter.recorded(folder) is None  # nothing was started
    assert not late.op.driver.cancel_step("d", "r", run.run_dir, 23)  # nothing is running
