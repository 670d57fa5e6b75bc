"""Environment variables for one test."""

from __future__ import annotations

from collections.abc import Mapping

import pytest


def set_env(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str]) -> None:
    """Each of `env` in os.environ until the test ends (monkeypatch undoes it)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
