"""The local backend tells the trainer who owns the run folder: ``RCPFLOW_RUN_OWNER`` is the
DAG run's task (the same for every try of it), the identity `rcpflow.trainer.ownership` compares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow_harness import FAST_RUN, run_dag_test

from tasks.names import RUN_DAG_ID

# A training job that only writes down the owner it was given, then fails (invalid input, 5):
# a job that succeeded without rows would leave dag.test's inline waits polling for a row while
# the train group's check, which would end them, cannot run beside them.
SHOW_OWNER = [
    "{python}",
    "-c",
    "import os, sys; open(sys.argv[1], 'w').write(os.environ['RCPFLOW_RUN_OWNER']); sys.exit(5)",
    "{run_dir}.owner",
]


@pytest.mark.timeout(300)
def test_the_local_trainer_is_given_the_dag_runs_task_as_its_owner(
    airflow_db: str, tmp_path: Path
) -> None:
    from airflow.models import DagRun
    from airflow.utils.session import create_session

    deployment = tmp_path / "d.toml"
    deployment.write_text(
        "allow_run_dirs_outside_root = true\n"
        "[job_env]\nRCPFLOW_RUN_OWNER = 'not this one'\n"
        f"[jobs.train]\ncommand = {json.dumps(SHOW_OWNER)}\n"
    )
    run_dir = tmp_path / "run"

    result = run_dag_test(RUN_DAG_ID, {**FAST_RUN, "run_dir": str(run_dir)}, deployment)

    assert result.states[("train.job.run", -1)] == "failed", result.states
    with create_session() as session:
        run_ids = [r.run_id for r in session.query(DagRun).filter(DagRun.dag_id == RUN_DAG_ID)]
    owner = Path(f"{run_dir}.owner").read_text()
    assert owner in {f"airflow:{RUN_DAG_ID}/{run_id}/train.job.run" for run_id in run_ids}
