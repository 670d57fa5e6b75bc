"""README's module map names every module: a newcomer finds each file of the code folders
there, by its path (`rcpflow/verdict/gate.py`), or a package by its folder (`tpu_jobs/rcp/`)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("rcpflow", "tasks", "tpu_jobs", "plugins", "devtools")


def named_in(readme: str, path: Path) -> bool:
    relative = path.relative_to(ROOT)
    if path.name == "__init__.py":
        return f"`{relative.parent.as_posix()}/`" in readme
    return f"`{relative.as_posix()}`" in readme


def test_every_module_is_named_in_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    modules = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(modules) > 100
    missing = [str(p.relative_to(ROOT)) for p in modules if not named_in(readme, p)]
    assert missing == []


def test_a_module_missing_from_readme_is_found() -> None:
    assert not named_in("`rcpflow/verdict/gate.py`", ROOT / "rcpflow" / "verify.py")
    assert named_in("see `tpu_jobs/rcp/`", ROOT / "tpu_jobs" / "rcp" / "__init__.py")
