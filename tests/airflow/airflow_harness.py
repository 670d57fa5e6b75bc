"""Airflow test harness: a throwaway AIRFLOW_HOME and SQLite DB, the project's dags/ folder.

Airflow reads its configuration when first imported, so the environment is set here, before
any test module of this folder imports it; if something imported Airflow earlier with another
home, the tests would write into the wrong database, so that is refused loudly.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
PYTHON = sys.executable

HOME = tempfile.mkdtemp(prefix="rcpflow-airflow-home-")
AIRFLOW_ENV = {
    "AIRFLOW_HOME": HOME,
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    "JAX_PLATFORMS": "cpu",
}
if "airflow" in sys.modules and os.environ.get("AIRFLOW_HOME") != HOME:
    raise pytest.UsageError(
        "airflow was imported before tests/airflow/conftest.py could set AIRFLOW_HOME "
        f"(it is {os.environ.get('AIRFLOW_HOME')!r}); run these tests in their own process"
    )
os.environ.update(AIRFLOW_ENV)
os.environ.pop("RCPFLOW_DEPLOYMENT", None)


