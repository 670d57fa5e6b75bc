"""Progress of long command-line work: a line redrawn in place on a terminal, nothing in a log.

A command's result lines are its contract (scripts and Airflow task logs read them); progress
is only for a person watching, so it goes to stderr and only when stderr is a terminal. In a log
(a task's captured output, a CI job) it writes nothing at all.
"""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    """``with Progress("importing", total) as p: ... p.advance(note)``."""

    def __init__(self, what: str, total: int, stream: TextIO | None = None) -> None:
        self.what = what
        self.total = total
        self.done = 0
        self.stream = sys.stderr if stream is None else stream
        self.shown = self.stream.isatty()
        self._width = 0

    def advance(self, note: str = "") -> None:
        self.done += 1
        if not self.shown:
            return
        line = f"{self.what}: {self.done}/{self.total}" + (f" ({note})" if note else "")
        # pad over a longer previous line, then return to the start of the line
        self.stream.write("\r" + line.ljust(self._width))
        self._width = max(self._width, len(line))
        self.stream.flush()

    def close(self) -> None:
        if self.shown and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
