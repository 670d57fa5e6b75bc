"""MaxText's environment for the MaxText job tests (`maxtext`), built here if it is missing and
the tests skipped only where it can be neither built nor entered (`maxtext_ready`)."""

from __future__ import annotations

import pytest
from maxtext_harness import MaxTextEnv
from maxtext_ready import ensure_maxtext_env


@pytest.fixture(scope="session")
def maxtext() -> MaxTextEnv:
    ensure_maxtext_env()
    return MaxTextEnv()
