"""The whole 3-seed submission of `make demo BACKEND=slurm` on the distributed Airflow: every
task ran on one of the two Celery workers, each with its own /tmp, home and logs folder, so
nothing a task left on its host's disk could reach another task, and nothing the API shows of a
task's log came from a folder the API server shares with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from distributed_cluster import Cluster

from devtools import demo
from devtools.servers.distributed_airflow import WORKERS
from tasks.names import COMPLIANCE_TOOL, RUN_DAG_ID, SUBMISSION_DAG_ID
from tasks.results.verdicts import read_verdict

SEEDS = (1, 2, 3)
SUBMISSION_TOOLS = ("rcp_checker", "package_checker", "result_summarizer")


@pytest.mark.slow
@pytest.mark.timeout(45 * 60)
def test_a_three_seed_slurm_submission_under_celery_passes_every_checker(
    cluster: Cluster,
) -> None:
    airflow = cluster.airflow
    conf = demo.demo_conf(SEEDS, 256, 40, "slurm", storage_root=cluster.storage)
    run_id = airflow.trigger(SUBMISSION_DAG_ID, conf, run_id="distributed__submission")

    state = airflow.wait_for_run(SUBMISSION_DAG_ID, run_id, demo.SLURM_TIMEOUT_S)

    submission_tis = airflow.task_instances(SUBMISSION_DAG_ID, run_id)
    assert state == "success", [(t["task_id"], t["state"]) for t in submission_tis]
    out_dir = cluster.storage / demo.NAME
    for tool in SUBMISSION_TOOLS:
        verdict = read_verdict(str(out_dir), tool)
        assert verdict is not None and verdict.ok, (tool, verdict)
    evaluations = []
    for seed in SEEDS:
        run_dir = out_dir / "runs" / f"seed_{seed}"
        verdict = read_verdict(str(run_dir), COMPLIANCE_TOOL)
        assert verdict is not None and verdict.ok, (seed, verdict)
        tis = airflow.task_instances(RUN_DAG_ID, f"{demo.NAME}__seed_{seed}")
        evaluations += [
            t
            for t in tis
            if t["task_id"] == "evaluation.checkpoint.evaluate" and t["state"] == "success"
        ]
    # The mapped evaluations were spread over both workers, each known by its own hostname.
    assert {t["hostname"] for t in evaluations} == {w.host for w in WORKERS}, [
        (t["map_index"], t["hostname"]) for t in evaluations
    ]
    # A task's log lies in its worker's own logs folder, not the API server's: the API fetched
    # it from that worker's log server.
    first = evaluations[0]
    local = Path(airflow.config.home) / "logs" / f"dag_id={RUN_DAG_ID}"
    assert not list(local.glob(f"run_id={first['dag_run_id']}/task_id={first['task_id']}/**/*"))
    text = airflow.task_log(
        RUN_DAG_ID,
        first["dag_run_id"],
        first["task_id"],
        map_index=first["map_index"],
        try_number=first["try_number"],
    )
    assert text and "Could not read served logs" not in text, text[-2000:]
