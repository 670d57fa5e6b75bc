"""Once a step passes, the evaluation jobs of higher steps still running are stopped (by PID on
the local backend) and their tasks end skipped naming the passing step; nothing at or below
the passing step is ever stopped, whichever evaluation finishes first.

The jobs are real processes of the local backend's launcher (an interpreter wrapper that
sleeps instead of evaluating); the decision comes from the summaries on storage.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSkipException
from airflow_harness import PYTHON, write_deployment

from devtools.synthetic_run import make_run
from tasks.backends.local import JobRecords, LocalBackend
from tasks.deployment import _load
from tasks.run.stages import cancel_above, evaluate_target, step_target


def sleeping_python(folder: Path) -> Path:
    """An interpreter whose evaluation jobs sleep (a long evaluation that never finishes)."""
    wrapper = folder / "python"
    wrapper.write_text(
        f"#!{PYTHON}\n"
        "import os, sys, time\n"
        "if sys.argv[1:3] == ['-m', 'tpu_jobs.evaluate']:\n"
        "    time.sleep(120)\n"
        "    sys.exit(0)\n"
        f"os.execv({PYTHON!r}, [{PYTHON!r}, *sys.argv[1:]])\n"
    )
    wrapper.chmod(0o755)
    return wrapper


class Evaluation(threading.Thread):
    """One evaluate task of the local backend, run in a thread: what it returned or raised."""

    def __init__(self, backend: LocalBackend, run_dir: str, step: int) -> None:
        super().__init__(daemon=True)
        self.backend, self.run_dir, self.step = backend, run_dir, step
        self.outcome: Any = None

    def run(self) -> None:
        launch, cancel = self.backend._launcher(), self.backend.cancel_evaluation
        target = step_target(self.run_dir, self.step)
        try:
            self.outcome = evaluate_target(
                target, lambda d, s: launch(d, s, lambda: step_target(d, s)), cancel
            )
        except BaseException as exc:  # what the task would end with
            self.outcome = exc


def wait_until(condition: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    deployment = _load(str(write_deployment(tmp_path / "d.toml", str(sleeping_python(tmp_path)))))
    return LocalBackend(deployment, records=JobRecords(tmp_path / "jobs"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("passing_first", [True, False])
def test_a_pass_stops_the_running_higher_evaluations_and_nothing_below(
    tmp_path: Path, backend: LocalBackend, passing_first: bool
) -> None:
    # rows 18..24; step 20's summary passes once it is written; 19 (below) and 21, 22 (above)
    # are being evaluated by running jobs
    run = make_run(str(tmp_path / "run"), max_steps=24, accuracies={18: 0.3})
    running = {s: Evaluation(backend, run.run_dir, s) for s in (19, 21, 22)}
    for job in running.values():
        job.start()
    records = backend.records
    wait_until(lambda: all(records.running(run.run_dir, s) for s in running))
    pids = {s: records.running(run.run_dir, s) for s in running}

    if passing_first:
        # the passing step's own evaluation ends (its summary written by its job) and stops
        # the higher ones
        make_run(run.run_dir, max_steps=24, accuracies={18: 0.3, 20: 0.9})
        passed = Evaluation(backend, run.run_dir, 20)
        passed.run()
        assert passed.outcome["target_reached"] is True
    else:
        # any order: the pass is read back from storage by a later check of the same run
        make_run(run.run_dir, max_steps=24, accuracies={18: 0.3, 20: 0.9})
        assert cancel_above(run.run_dir, 20, backend.cancel_evaluation) == [21, 22]

    for step in (21, 22):
        running[step].join(timeout=60)
        outcome = running[step].outcome
        assert isinstance(outcome, AirflowSkipException), outcome
        assert str(outcome).startswith(f"step {step}: skipped, its evaluation was stopped: step 20")
        assert records.running(run.run_dir, step) is None
    # the step below the passing one is still being evaluated
    assert records.running(run.run_dir, 19) == pids[19]
    assert running[19].is_alive()
    # and a stop asked for at or below the passing step is refused by cancel_above's rule
    assert cancel_above(run.run_dir, 20, lambda d, s: s <= 20) == []
    backend.cancel_evaluation(run.run_dir, 19)  # clean up (the test's own job)
    running[19].join(timeout=60)


@pytest.mark.timeout(120)
def test_a_higher_step_started_after_the_pass_launches_nothing(
    tmp_path: Path, backend: LocalBackend
) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=24, accuracies={18: 0.3, 19: 0.9})
    late = Evaluation(backend, run.run_dir, 23)
    late.run()
    assert isinstance(late.outcome, AirflowSkipException)
    assert str(late.outcome).startswith("step 23: skipped, not evaluated: step 19 already passed")
    assert backend.records.running(run.run_dir, 23) is None
    assert not backend.cancel_evaluation(run.run_dir, 23)  # nothing was running
