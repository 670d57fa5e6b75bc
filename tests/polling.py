"""Waiting in a test for something another process or thread does: one poll loop."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    predicate: Callable[[], object],
    timeout_s: float,
    what: str = "condition",
    interval_s: float = 0.05,
) -> None:
    """Poll `predicate` until it returns true; TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready after {timeout_s:.0f}s")
        time.sleep(interval_s)
