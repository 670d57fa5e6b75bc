"""MaxText's environment for the tests that run in it (tests/tpu_jobs/maxtext/, the MaxText DAG
run in tests/airflow/): the Python 3.13 venv in a Debian 13 root that `devtools.servers.maxtext_env`
builds and caches (``make system-packages`` builds it first; a session that finds it missing
builds it here, as root, about 2 minutes)."""

from __future__ import annotations

import pytest

from devtools.servers import maxtext_env


def ensure_maxtext_env() -> None:
    """Build the environment if it is missing; skip the test, naming what is missing, only where
    it can be neither built nor entered (not root, no debootstrap). In CI (root) it runs."""
    missing = maxtext_env.missing_tools()
    if missing:
        pytest.skip(
            "MaxText's environment (devtools/servers/maxtext_env.py, a Debian 13 root) cannot be "
            f"built or entered here: missing {', '.join(missing)}"
        )
    maxtext_env.ensure_env()
