"""MaxText's environment for the MaxText job tests (`maxtext`): the Python 3.13 venv in a
Debian 13 root that `devtools.servers.maxtext_env` builds and caches (``make system-packages``
builds it first; a session that finds it missing builds it here, about 2 minutes). Skipped,
with the reason, only where it can be neither built nor entered (not root, no debootstrap); in
CI (root) every test runs."""

from __future__ import annotations

import pytest
from maxtext_harness import MaxTextEnv

from devtools.servers import maxtext_env


@pytest.fixture(scope="session")
def maxtext() -> MaxTextEnv:
    missing = maxtext_env.missing_tools()
    if missing:
        pytest.skip(
            "MaxText's environment (devtools/servers/maxtext_env.py, a Debian 13 root) cannot be "
            f"built or entered here: missing {', '.join(missing)}"
        )
    maxtext_env.ensure_env()
    return MaxTextEnv()
