"""Airflow 3.3.2's deferral race, forced, under the real scheduler: when a deferred task's
trigger fires before the scheduler has processed the executor's report that the deferring try
ended, the scheduler takes that stale report for the resumed try and fails it ("finished with
state success, but the task instance's state attribute is queued"; apache/airflow#67287, fixed
after 3.3.2). `make demo` lost a decided run to it 4 times in 6.

The hook point (`deferral_hold/sitecustomize.py`, first on the PYTHONPATH of this test's Airflow
only) holds every deferring try of the run's training job and evaluations until the metadata
database shows its trigger has fired, so the stale report always comes last. On the code
before tasks/backend_api/task_end.py each held task was released by its resumed try (queued or
already running) and the run failed (2 of its 6 evaluations failed by the stale report, its
finalize upstream_failed); now the trigger ends the task itself (no try is resumed on a worker), the
stale report finds it ended, and the run is decided."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow_harness import CONVERGING_RUN, failures, run_under_scheduler
from repo_paths import REPO

from devtools.servers.airflow_server import LocalAirflow
from rcpflow.files.layout import RunLayout
from rcpflow.records.mllog import read_events
from tasks.backends.local.processes import DEFAULT_JOBS_ROOT, job_folder
from tasks.deployment import DEFAULT_TOML
from tasks.names import RUN_DAG_ID
from tasks.results.verdicts import read_verdict

HOOK = Path(__file__).parent / "deferral_hold"
HELD = ("train.job.run", "evaluation.checkpoint.evaluate")


@pytest.fixture(scope="module")
def held(
    tmp_path_factory: pytest.TempPathFactory, start_airflow: Callable[..., Any]
) -> Iterator[tuple[LocalAirflow, Path]]:
    """The embedded default's Airflow with the hold armed; the file the holds are recorded in."""
    folder = tmp_path_factory.mktemp("race")
    deployment = folder / "deployment.toml"
    deployment.write_text("allow_run_dirs_outside_root = true\n" + DEFAULT_TOML)
    record = folder / "holds.jsonl"
    env = {
        "RCPFLOW_DEPLOYMENT": str(deployment),
        "PYTHONPATH": f"{HOOK}{os.pathsep}{REPO}",
        "RCPFLOW_HOLD_DEFERRED": ",".join(HELD),
        "RCPFLOW_HOLD_RECORD": str(record),
    }
    # parallelism 4: a held try keeps its executor slot while the task goes on
    with start_airflow(folder / "airflow", env, parallelism=4, dag_ids=(RUN_DAG_ID,)) as server:
        yield server, record


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_is_decided_when_every_trigger_fires_before_its_deferring_try_ended(
    held: tuple[LocalAirflow, Path], tmp_path: Path
) -> None:
    server, record = held
    run_dir = tmp_path / "run"
    run = run_under_scheduler(
        server, RUN_DAG_ID, {**CONVERGING_RUN, "run_dir": str(run_dir)}, timeout_s=600
    )
    assert run.state == "success", failures(run, server)
    holds = [json.loads(line) for line in record.read_text().splitlines()]
    # the order was forced for the training and for every evaluation that started a job ...
    assert {h["task_id"] for h in holds} == set(HELD), holds
    # ... and each of them was ended by its trigger while its deferring try still ran
    assert all(h["released_by"] in ("success", "skipped") for h in holds), holds
    (stop,) = [e for e in read_events(RunLayout(str(run_dir)).mllog(1)) if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    verdict = read_verdict(str(run_dir), "compliance_checker")
    assert verdict is not None and verdict.ok
    evaluated = [t for t in run.tis if t["task_id"] == HELD[1] and t["state"] == "success"]
    assert len(evaluated) == len([h for h in holds if h["task_id"] == HELD[1]])
    # the teardowns read the records the triggerer pushed with each task's end: every job's
    # folder of the run is gone (an unread record leaves it: it did on Airflow 3.3.2, which
    # stores those XComs JSON-encoded twice)
    jobs = job_folder(DEFAULT_JOBS_ROOT, RUN_DAG_ID, run.run_id, str(run_dir), "train").parent
    assert not jobs.exists(), sorted(p.name for p in jobs.iterdir())
    # no try was resumed on a worker or retried: each task that ran, ran once
    ran = [t for t in run.tis if t["task_id"] in HELD and t["state"] == "success"]
    assert ran and all(t["try_number"] == 1 for t in ran), ran
