"""The training reward and loss of a run from its trainer's own log, read through Airflow.

The trainers print one JSON line per update (step, mean reward, loss, weight-update time); the
train task streams them into its task log. When the MLLOG carries no tracked training stats,
the view reads that log with Airflow's own reader (`TaskLogReader`: local files, a log server or
remote logging, whatever the deployment configured) for the ``train.*`` task instances of the
``mlperf_grpo_run`` DAG run that trained the folder, and parses it with
`tasks.views.convergence.trainer_points`. A log that cannot be read is a named problem of the run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rcpflow.files.layout import normalize_root
from tasks.names import RUN_DAG_ID
from tasks.views.convergence import TrainingPoint, trainer_points
from tasks.views.storage_index import RunView

TRAIN_GROUP = "train."


def run_dags(session: Any) -> dict[str, str]:
    """Run folder (normalized) -> the newest mlperf_grpo_run DAG run that trained it."""
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select

    rows = session.execute(
        select(DagRun.run_id, DagRun.conf).where(DagRun.dag_id == RUN_DAG_ID).order_by(DagRun.id)
    )
    found: dict[str, str] = {}
    for run_id, conf in rows:
        given = (conf or {}).get("run_dir")
        if isinstance(given, str) and given:
            found[normalize_root(given)] = str(run_id)  # later runs win
    return found


def dag_run_of(session: Any, run_dir: str) -> str | None:
    """The newest mlperf_grpo_run DAG run whose ``run_dir`` conf is this folder."""
    return run_dags(session).get(normalize_root(run_dir))


def _events(session: Any, dag_run_id: str) -> list[str]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.log.log_reader import TaskLogReader
    from sqlalchemy import select

    tis = session.scalars(
        select(TaskInstance).where(
            TaskInstance.dag_id == RUN_DAG_ID,
            TaskInstance.run_id == dag_run_id,
            TaskInstance.task_id.startswith(TRAIN_GROUP),
        )
    ).all()
    reader = TaskLogReader()
    lines: list[str] = []
    for ti in tis:
        for try_number in range(1, (ti.try_number or 0) + 1):  # a resumed trainer: all tries
            metadata: Any = {}  # Airflow's LogMetadata: empty, read from the start
            stream, _ = reader.read_log_chunks(ti, try_number, metadata)
            lines += [str(getattr(item, "event", item)) for item in stream]
    return lines


def with_trainer_log(session: Any, run: RunView, dag_run_id: str | None) -> RunView:
    """`run` with the training points of its trainer's log, unless its MLLOG has them."""
    if run.training:
        return run
    dag_run_id = dag_run_id or dag_run_of(session, run.run_dir)
    if dag_run_id is None:
        return run
    try:
        points: tuple[TrainingPoint, ...] = trainer_points(_events(session, dag_run_id))
    except Exception as exc:  # any log backend's failure: named, the page still renders
        problem = f"trainer log of DAG run {dag_run_id}: {type(exc).__name__}: {exc}"
        return dataclasses.replace(run, problems=(*run.problems, problem))
    return dataclasses.replace(run, training=points)
