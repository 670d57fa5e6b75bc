"""The repository's root, for tests that read its files or run commands in it (one definition
instead of a ``Path(__file__).parents[...]`` per test file)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
