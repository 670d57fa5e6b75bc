"""Tests mirror the code: every package of rcpflow/, tasks/, tpu_jobs/ and devtools/ has its test
folder at the same path under tests/ (holding at least one test module), or is listed below with
the reason it is covered elsewhere; benchmarks live only in devtools/bench/."""

from __future__ import annotations

from pathlib import Path

from repo_paths import REPO

SOURCE_ROOTS = ("rcpflow", "tasks", "tpu_jobs", "devtools")
# Packages without a mirrored test folder, and where their modules are tested instead.
COVERED_ELSEWHERE = {
    "tasks/backends": (
        "registry.py and the backends' settings tables in "
        "tests/tasks/test_deployment_and_jobs.py; each backend in its own folder"
    ),
    "tasks/results": (
        "the verdict files and assets every run and submission DAG test of tests/airflow/ "
        "writes and reads back, and the RCP view's tests (tests/airflow/test_rcp_view_*.py)"
    ),
}


def packages(root: Path = REPO) -> list[str]:
    found = []
    for top in SOURCE_ROOTS:
        for init in sorted((root / top).rglob("__init__.py")):
            found.append(init.parent.relative_to(root).as_posix())
    return found


def unmirrored(root: Path = REPO) -> list[str]:
    """Packages with no test module at their path under tests/ and no entry above."""
    return [
        p
        for p in packages(root)
        if p not in COVERED_ELSEWHERE and not any((root / "tests" / p).glob("test_*.py"))
    ]


def test_every_package_has_a_mirrored_test_folder() -> None:
    assert unmirrored() == []


def test_the_covered_elsewhere_list_is_not_stale() -> None:
    here = set(packages())
    assert [p for p in COVERED_ELSEWHERE if p not in here] == []
    mirrored = [p for p in COVERED_ELSEWHERE if any((REPO / "tests" / p).glob("test_*.py"))]
    assert mirrored == [], "now mirrored: drop them from COVERED_ELSEWHERE"


def test_benchmarks_live_only_in_devtools() -> None:
    benches = [
        p.relative_to(REPO).as_posix()
        for top in (*SOURCE_ROOTS, "tests")
        for p in (REPO / top).rglob("*bench*.py")
        if not p.name.startswith("test_")
    ]
    assert "devtools/bench/verdict_bench.py" in benches
    assert [b for b in benches if not b.startswith("devtools/bench/")] == []


def test_no_devtools_package_inside_the_product() -> None:
    inside = [
        p.relative_to(REPO).as_posix()
        for top in SOURCE_ROOTS
        if top != "devtools"
        for p in (REPO / top).rglob("devtools")
    ]
    assert inside == []


# Issue 33's bar: a module past this is doing more than one job (split it by job).
MAX_MODULE_LINES = 800


def test_no_module_is_over_800_lines() -> None:
    long = {
        p.relative_to(REPO).as_posix(): n
        for top in (*SOURCE_ROOTS, "dags", "plugins", "tests")
        for p in (REPO / top).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_a_package_without_tests_is_named(tmp_path: Path) -> None:
    for path in ("rcpflow/__init__.py", "rcpflow/a/__init__.py", "rcpflow/b/__init__.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    (tmp_path / "tests/rcpflow/a").mkdir(parents=True)
    (tmp_path / "tests/rcpflow/a/test_x.py").write_text("")
    (tmp_path / "tests/rcpflow/test_top.py").write_text("")
    assert unmirrored(tmp_path) == ["rcpflow/b"]
