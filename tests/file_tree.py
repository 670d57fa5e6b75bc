"""The bytes of a folder tree, for tests that prove a rejected input changed nothing on disk,
and appending to a file (trainer output after the fact, a corrupted line)."""

from __future__ import annotations

from pathlib import Path


def tree_bytes(root: Path) -> dict[str, bytes | None]:
    """Every file and folder under `root` by relative path (folders as None), but the lock
    sidecars of local storage (``.<name>.lock``, `rcpflow.files.storage`): empty, never data."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
        if not (p.name.startswith(".") and p.name.endswith(".lock") and p.is_file())
    }


def append_bytes(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)
