"""A hook point for tests/airflow/test_airflow_deferral_race.py, first on the PYTHONPATH of
that test's Airflow processes only: a task of `RCPFLOW_HOLD_DEFERRED` (task ids, comma-separated)
that has just deferred is held before its process ends until the metadata database shows its
trigger has fired and the task moved on (queued or running again, or ended). So the executor's
report that the deferring try ended reaches the scheduler only after the trigger's event: the
order of Airflow 3.3.2's deferral race (apache/airflow#67287), forced rather than waited for.
Each hold appends one JSON line to `RCPFLOW_HOLD_RECORD`: the task, its map index, the state
that released it and how long it was held."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sqlite3
import sys
import time
from typing import Any

_TARGET = "airflow.sdk.execution_time.task_runner"
_HOLD = {t for t in os.environ.get("RCPFLOW_HOLD_DEFERRED", "").split(",") if t}
# Released by these: the trigger fired and the task was queued to resume, or it was ended.
_MOVED_ON = {"queued", "running", "success", "failed", "skipped", "up_for_retry", "upstream_failed"}
_LIMIT_S = 300.0


def _state(ti: Any) -> str | None:
    db = os.path.join(os.environ["AIRFLOW_HOME"], "airflow.db")
    with sqlite3.connect(db, timeout=30) as conn:
        row = conn.execute(
            "SELECT state FROM task_instance WHERE dag_id=? AND task_id=? AND run_id=? "
            "AND map_index=?",
            (ti.dag_id, ti.task_id, ti.run_id, ti.map_index),
        ).fetchone()
    return None if row is None else row[0]


def _hold(ti: Any) -> None:
    start = time.monotonic()
    state = _state(ti)
    while state not in _MOVED_ON and time.monotonic() - start < _LIMIT_S:
        time.sleep(0.2)
        state = _state(ti)
    record = {
        "task_id": ti.task_id,
        "map_index": ti.map_index,
        "run_id": ti.run_id,
        "released_by": state,
        "held_s": round(time.monotonic() - start, 2),
    }
    with open(os.environ["RCPFLOW_HOLD_RECORD"], "a") as f:
        f.write(json.dumps(record) + "\n")


def _patch(module: Any) -> None:
    original = module.finalize

    def finalize(ti: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
        if str(state) in ("deferred", "TaskInstanceState.DEFERRED") and ti.task_id in _HOLD:
            _hold(ti)
        return original(ti, state, *args, **kwargs)

    module.finalize = finalize


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module  # type: ignore[union-attr]

        def patched(module: Any) -> None:
            exec_module(module)
            _patch(module)

        loader.exec_module = patched  # type: ignore[method-assign, union-attr]
        return spec


if _HOLD:
    sys.meta_path.insert(0, _Finder())
