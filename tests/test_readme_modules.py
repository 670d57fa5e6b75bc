"""docs/architecture.md's module map names every module: a newcomer finds each file of the code
folders there, by its path (`rcpflow/verdict/gate.py`), or a package by its folder
(`tpu_jobs/rcp/`). README is the front door; the map lives in docs/architecture.md."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_MAP = ROOT / "docs" / "architecture.md"
FOLDERS = ("rcpflow", "tasks", "tpu_jobs", "dags", "plugins", "devtools")


def named_in(text: str, path: Path) -> bool:
    relative = path.relative_to(ROOT)
    if path.name == "__init__.py":
        return f"`{relative.parent.as_posix()}/`" in text
    return f"`{relative.as_posix()}`" in text


def test_every_module_is_named_in_the_module_map() -> None:
    text = MODULE_MAP.read_text()
    modules = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(modules) > 100
    assert any(p.parent.name == "dags" for p in modules)
    missing = [str(p.relative_to(ROOT)) for p in modules if not named_in(text, p)]
    assert missing == []


def test_a_module_missing_from_the_module_map_is_found() -> None:
    assert not named_in("`rcpflow/verdict/gate.py`", ROOT / "rcpflow" / "verify.py")
    assert named_in("see `tpu_jobs/rcp/`", ROOT / "tpu_jobs" / "rcp" / "__init__.py")
