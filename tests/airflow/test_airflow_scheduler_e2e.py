"""End to end under a real scheduler: Airflow on 127.0.0.1 started by the test, a run triggered
through the REST API with conf, followed to completion, stopped by PID. Every test runs twice:
with Airflow's metadata DB on SQLite and on PostgreSQL (a private server started by the test,
as a deployment has it). The three-seed submission runs elsewhere, once per metadata DB: on
SQLite it is the demo's (tests/devtools/test_demo.py), on PostgreSQL the distributed Airflow's
(tests/airflow/distributed/test_distributed_submission.py)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow_harness import CONVERGING_RUN, alive, failures, run_under_scheduler

from devtools.servers.airflow_server import AirflowServerError, LocalAirflow
from devtools.servers.postgres_server import LocalPostgres, server_bindir
from rcpflow.files.layout import RunLayout
from rcpflow.records.mllog import read_events
from tasks.deployment import DEFAULT_TOML
from tasks.names import RUN_DAG_ID, SUBMISSION_DAG_ID
from tasks.results.verdicts import read_verdict


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def metadata_db(request: pytest.FixtureRequest) -> Iterator[LocalPostgres | None]:
    """None for SQLite in AIRFLOW_HOME; else a private PostgreSQL, stopped by PID after."""
    if request.param == "sqlite":
        yield None
        return
    if server_bindir() is None:
        pytest.skip(
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: install "
            "Debian's postgresql package (`make system-packages`; CI does)"
        )
    postgres = LocalPostgres("airflow")
    try:
        postgres.start()
        yield postgres
    finally:
        pid = postgres.pid
        postgres.stop()
    assert pid is not None and not alive(pid)


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    metadata_db: LocalPostgres | None,
    start_airflow: Callable[..., Any],
) -> Iterator[LocalAirflow]:
    # The embedded default's settings, with the run folders in the tests' temp dirs.
    deployment = tmp_path_factory.mktemp("deployment") / "deployment.toml"
    deployment.write_text("allow_run_dirs_outside_root = true\n" + DEFAULT_TOML)
    env = {"RCPFLOW_DEPLOYMENT": str(deployment)}
    if metadata_db is not None:
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = metadata_db.sqlalchemy_url()
    home = tmp_path_factory.mktemp("airflow")
    with start_airflow(home, env, dag_ids=(RUN_DAG_ID, SUBMISSION_DAG_ID)) as server:
        yield server


def _dag_run_state_in_db(postgres: LocalPostgres, dag_id: str, run_id: str) -> str:
    """What the metadata DB itself holds for a run: proof that Airflow ran on this server."""
    import psycopg2

    with (
        contextlib.closing(
            psycopg2.connect(
                host="127.0.0.1", port=postgres.port, user="postgres", dbname=postgres.database
            )
        ) as connection,
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "SELECT state FROM dag_run WHERE dag_id = %s AND run_id = %s", (dag_id, run_id)
        )
        rows = cursor.fetchall()
    assert len(rows) == 1, rows
    return str(rows[0][0])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bad_conf_is_refused_by_the_api(server: LocalAirflow, tmp_path: Path) -> None:
    with pytest.raises(AirflowServerError, match="HTTP 400"):
        server.trigger("mlperf_grpo_submission", {"seeds": [1, 1, 2]})
    bad = {**CONVERGING_RUN, "run_dir": str(tmp_path / "run"), "global_batch_size": 100}
    with pytest.raises(AirflowServerError, match="HTTP 400"):
        server.trigger("mlperf_grpo_run", bad)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_dag_under_the_scheduler(
    server: LocalAirflow, metadata_db: LocalPostgres | None, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    conf = {**CONVERGING_RUN, "run_dir": str(run_dir)}
    run = run_under_scheduler(server, "mlperf_grpo_run", conf, timeout_s=600)

    assert run.state == "success", failures(run, server)
    if metadata_db is not None:
        assert _dag_run_state_in_db(metadata_db, "mlperf_grpo_run", run.run_id) == "success"
    else:
        assert (Path(server.config.home) / "airflow.db").is_file()
    events = read_events(RunLayout(str(run_dir)).mllog(1))
    (stop,) = [e for e in events if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    passed = stop.metadata["samples_count"] // 256
    verdict = read_verdict(str(run_dir), "compliance_checker")
    assert verdict is not None and verdict.ok
    # With the eval window of 1 the scheduler evaluates in step order, one at a time, and
    # never starts a step after the passing one.
    first, last = CONVERGING_RUN["val_start_at"], CONVERGING_RUN["max_steps"]
    assert first < passed < last
    evals = sorted(
        (t for t in run.tis if t["task_id"] == "evaluation.checkpoint.evaluate"),
        key=lambda t: t["map_index"],
    )
    assert [first + t["map_index"] for t in evals] == list(range(first, last + 1))
    ran = [t for t in evals if t["state"] == "success"]
    assert [first + t["map_index"] for t in ran] == list(range(first, passed + 1))
    # every instance that ran is labelled by its step; those above the passing step never
    # start a task process (their wait ends skipped on the triggerer, so the scheduler skips
    # them): Airflow 3.3 leaves them their bare map index (docs/airflow.md)
    assert [t["rendered_map_index"] for t in ran] == [f"step {s}" for s in range(first, passed + 1)]
    above = [t for t in evals if first + t["map_index"] > passed]
    assert all(t["state"] == "skipped" for t in above)
    # no task process ran for them (a pid is the task process's); the API shows the bare map
    # index where no label was rendered
    assert all(t["pid"] is None for t in above), [(t["map_index"], t["pid"]) for t in above]
    assert all(t["rendered_map_index"] == str(t["map_index"]) for t in above)
    waits = {t["map_index"]: t for t in run.tis if t["task_id"] == "evaluation.checkpoint.wait"}
    assert all(waits[t["map_index"]]["state"] == "skipped" for t in above)
    for earlier, later in itertools.pairwise(ran):
        assert earlier["end_date"] <= later["start_date"]
