"""An MLLOG file as text, read the way the official parser (`mlperf_logging`'s mlp_parser) reads it.

Latin-1 text, lines split as Python's text mode does, lines without ``:::MLLOG `` skipped, an
event's JSON after the last token on its line: rcpflow and the checker agree on a log's events,
and every byte round-trips (docs/design.md, verification of foreign inputs).
"""

from __future__ import annotations

import re

from rcpflow.files.storage import storage_for

ENCODING = "latin-1"
TOKEN = ":::MLLOG "

# A line and its ending, as universal-newlines text mode splits them.
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def decode(data: bytes) -> str:
    """The log's bytes as text (never fails: latin-1 maps every byte to one character)."""
    return data.decode(ENCODING)


def encode(text: str) -> bytes:
    """Back to the exact bytes `decode` read (the events rcpflow renders are ASCII)."""
    return text.encode(ENCODING)


def lines(text: str, keepends: bool = False) -> list[str]:
    """The lines of `text`, split where the parser splits them."""
    found = _LINE.findall(text)
    return found if keepends else [line.rstrip("\r\n") for line in found]


def payload(line: str) -> str | None:
    """The event JSON of one line as the parser takes it, or None for a line it skips."""
    pos = line.rfind(TOKEN)
    if pos < 0:
        return None
    return line[pos + len(TOKEN) :].rstrip()


def read(path: str) -> str:
    """The log at `path` (local or ``gs://``) as text; FileNotFoundError if it is absent."""
    return decode(storage_for(path).read_bytes(path))
