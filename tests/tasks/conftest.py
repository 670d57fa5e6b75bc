"""The unit tests of `tasks/` (the end-to-end DAG runs are in tests/airflow/).

Airflow imported by these tests (in-process ones) must not write into ~/airflow: a throwaway
AIRFLOW_HOME, unless another test folder's harness (tests/airflow/airflow_harness.py, collected
first in a whole-suite run) configured it already, which then wins. Nothing here names a
deployment: a test that needs one writes it and points RCPFLOW_DEPLOYMENT at it.
"""

from __future__ import annotations

import os
import sys
import tempfile

if "AIRFLOW_HOME" not in os.environ and "airflow" not in sys.modules:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="rcpflow-tasks-airflow-home-")
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.pop("RCPFLOW_DEPLOYMENT", None)
