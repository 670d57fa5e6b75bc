"""Which failures are the user's input, and how each is told in one line.

`USER_ERRORS` are rcpflow's own errors (ValueErrors naming what is wrong), OSError (a folder
where a file belongs, unreadable) and StorageError (``gs://`` without credentials). Whoever faces
a user catches them and reports `describe(e)`: one line, never a traceback; anything else is a
bug and keeps its traceback. Exit codes: docs/exit-codes.md.
"""

from __future__ import annotations

from rcpflow.files.storage import StorageError

USER_ERRORS: tuple[type[Exception], ...] = (ValueError, OSError, StorageError)


def describe(e: BaseException) -> str:
    """`e` as one line: an OSError as ``<path>: <reason>``, anything else by its message."""
    if isinstance(e, OSError) and e.strerror and e.filename is not None:
        where = repr(e.filename) if e.filename == "" else str(e.filename)
        text = f"{where}: {e.strerror}"
        if e.filename2 is not None:
            text += f" (and {e.filename2})"
    else:
        text = str(e) or type(e).__name__
    return " ".join(text.split())
