"""Outside input in rcpflow's property tests: a text a reader accepts reads back as the same
thing, one it refuses is refused in one line naming where it came from, never a traceback; and
the forecast's flags, read as its command line reads them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from rcpflow.cli.forecast import add_arguments

T = TypeVar("T")


def one_line(e: Exception, where: str) -> None:
    text = str(e)
    assert text.startswith(where) and "\n" not in text and "Traceback" not in text, text


def accepted_or_one_line(
    error: type[Exception], where: str, read: Callable[..., T], *args: object
) -> T | None:
    """What `read(*args)` returns, or None when it raised `error` in one line starting with
    `where` (any other exception propagates)."""
    try:
        return read(*args)
    except error as e:
        one_line(e, where)
        return None


def forecast_args(*args: str) -> argparse.Namespace:
    """`rcpflow forecast ARGS` parsed as its command line does."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(args))
