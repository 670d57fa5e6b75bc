"""End to end under a real scheduler: Airflow on 127.0.0.1 started by the test, a run triggered
through the REST API with conf, followed to completion, stopped by PID."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from airflow_harness import CONVERGING_RUN, DAGS, REPO

from rcpflow.layout import RunLayout
from rcpflow.mllog import read_events
from tasks.airflow_server import AirflowServerError, LocalAirflow, ServerConfig, free_port
from tasks.verdicts import read_verdict


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_dag_under_the_scheduler(tmp_path: Path) -> None:
    config = ServerConfig(
        home=tmp_path / "airflow",
        dags_folder=DAGS,
        plugins_folder=REPO / "plugins",
        port=free_port(),
        parallelism=2,
        env={"JAX_PLATFORMS": "cpu", "RCPFLOW_DEPLOYMENT": ""},  # the embedded default
    )
    run_dir = tmp_path / "run"
    airflow = LocalAirflow(config)
    try:
        airflow.start()
        for dag_id in ("mlperf_grpo_run", "mlperf_grpo_submission"):
            airflow.wait_for_dag(dag_id)
        # An out-of-schema conf is refused by the API before a run exists.
        with pytest.raises(AirflowServerError, match="HTTP 400"):
            airflow.trigger("mlperf_grpo_submission", {"seeds": [1, 1, 2]})
        with pytest.raises(AirflowServerError, match="HTTP 400"):
            airflow.trigger(
                "mlperf_grpo_run",
                {**CONVERGING_RUN, "run_dir": str(run_dir), "global_batch_size": 100},
            )

        run_id = airflow.trigger("mlperf_grpo_run", {**CONVERGING_RUN, "run_dir": str(run_dir)})
        state = airflow.wait_for_run("mlperf_grpo_run", run_id, timeout_s=600)
        tis = airflow.task_instances("mlperf_grpo_run", run_id)
    finally:
        pids = [p.pid for p in airflow.processes.values()]
        airflow.stop()
    assert pids and not any(_alive(pid) for pid in pids)

    states = {(t["task_id"], t["map_index"]): t["state"] for t in tis}
    assert state == "success", states
    events = read_events(RunLayout(str(run_dir)).mllog(1))
    (stop,) = [e for e in events if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    passed = stop.metadata["samples_count"] // 256
    verdict = read_verdict(str(run_dir), "compliance_checker")
    assert verdict is not None and verdict.ok
    # With the eval window of 1 the scheduler evaluates in step order, one at a time, and
    # never starts a step after the passing one.
    evals = sorted(
        (t for t in tis if t["task_id"] == "evaluation.evaluate"), key=lambda t: t["map_index"]
    )
    steps = [24 + t["map_index"] for t in evals]
    assert steps == list(range(24, 35))
    ran = [t for t in evals if t["state"] == "success"]
    assert [24 + t["map_index"] for t in ran] == list(range(24, passed + 1))
    assert [t["rendered_map_index"] for t in ran] == [f"step {s}" for s in range(24, passed + 1)]
    assert all(t["state"] == "skipped" for t in evals if 24 + t["map_index"] > passed)
    for earlier, later in zip(ran, ran[1:], strict=False):
        assert earlier["end_date"] <= later["start_date"]
