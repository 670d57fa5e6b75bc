"""Which failures are the user's input, and how each is told in one line.

`USER_ERRORS` are rcpflow's own errors (ValueErrors naming what is wrong), OSError (a folder
where a file belongs, unreadable) and StorageError (``gs://`` without credentials). Whoever faces
a user catches them and reports `describe(e)`: one line, never a traceback; anything else is a
bug and keeps its traceback. Exit codes: docs/exit-codes.md. `refused_as` hands a lower
module's refusal on as the caller's own error, so that the caller's callers catch one kind.
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


class _RefusedAs:
    def __init__(self, error: type[Exception], kinds: tuple[type[Exception], ...]) -> None:
        self.error = error
        self.kinds = kinds

    def __enter__(self) -> None:
        return None

    # Returns None, not bool: the block's errors are never swallowed, so type checkers know
    # that a ``return`` inside the block is the function's only way out.
    def __exit__(self, kind: object, e: BaseException | None, tb: object) -> None:
        if isinstance(e, self.kinds):
            raise self.error(str(e)) from e


def refused_as(error: type[Exception], *kinds: type[Exception]) -> _RefusedAs:
    """``with refused_as(EvalImportError, ManifestError):``: a `kinds` error raised in the block
    is raised again as `error` with the same message (the original chained as its cause)."""
    return _RefusedAs(error, kinds)
