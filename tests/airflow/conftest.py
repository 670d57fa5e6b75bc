"""Fixtures for the Airflow tests; the environment itself is set by airflow_harness on import."""

from __future__ import annotations

import pytest
from airflow_harness import DAGS, HOME


@pytest.fixture(scope="session")
def airflow_db() -> str:
    """A fresh metadata DB for this session (created once: it takes a few seconds)."""
    from airflow.utils import db

    db.resetdb()
    return HOME


@pytest.fixture(scope="session")
def dagbag(airflow_db: str):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(str(DAGS))
