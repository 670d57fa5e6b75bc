"""The developer tools are not the product: the installed package leaves devtools/ out (the
images too: tests/docker/; no product module imports it: tests/test_layering.py). They run
from the repository root (tests/devtools/test_demo.py runs `python -m devtools.demo` there)."""

from __future__ import annotations

import tomllib

from repo_paths import REPO
from setuptools import find_packages


def test_the_installed_package_leaves_the_developer_tools_out() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = find_packages(where=str(REPO), include=include)
    assert {"rcpflow", "tasks", "tpu_jobs", "plugins"} <= set(shipped)
    assert [p for p in shipped if p.split(".")[0] == "devtools"] == []
