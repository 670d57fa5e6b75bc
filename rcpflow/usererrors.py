"""Which failures are the user's input, and how each is told in one line.

rcpflow's own errors name what is wrong (ManifestError, SummaryError, MLLogError,
FinalizeInputError and JSONInputError are ValueErrors); below them, a path can still be a folder
where a file belongs (or the reverse), unreadable, or a ``gs://`` path without credentials
(StorageError). Whoever faces a user (the CLI; a task) catches `USER_ERRORS` and reports
`describe(e)`: one line naming the thing, never a traceback. Anything else is a bug in rcpflow
and keeps its traceback.
"""

from __future__ import annotations

from rcpflow.storage import StorageError

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
