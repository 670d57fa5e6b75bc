"""A run folder another training holds now (its lease, `rcpflow.trainer.ownership`): the run
DAG's plan and the deferred evaluation's first task refuse it in one line naming the holder, so a
second DAG run on a live run folder starts no job there and writes nothing into it; the same DAG
run (a retry of its training), a stale lease and no lease at all are no refusal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rcpflow.trainer import ownership
from tasks.run.spec import RunFolderBusy, refuse_a_live_run


def test_a_folder_another_dag_runs_training_holds_is_refused_naming_it(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    refuse_a_live_run(run_dir, "mlperf_grpo_run", "second")  # no lease: nothing to refuse
    live = ownership.airflow_owner("mlperf_grpo_run", "first", "train.job.run")
    ownership.hold(run_dir, live, timeout_s=600)
    with pytest.raises(RunFolderBusy) as refused:
        refuse_a_live_run(run_dir, "mlperf_grpo_run", "second")
    said = str(refused.value)
    assert said.startswith(f"run_dir: {run_dir} is being trained by {live} ")
    assert "owner.json" in said and "\n" not in said
    # the live run itself (a retry of its training, its plan cleared and run again) goes on
    refuse_a_live_run(run_dir, "mlperf_grpo_run", "first")


def test_a_stale_lease_holds_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    ownership.hold(run_dir, ownership.airflow_owner("d", "first", "t"), timeout_s=600)
    monkeypatch.setattr(ownership, "now_ms", lambda: 10**13)  # its heartbeat far in the past
    refuse_a_live_run(run_dir, "d", "second")
