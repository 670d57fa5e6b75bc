"""The import arrows point one way: dags -> tasks -> rcpflow <- tpu_jobs.

Checked in fresh interpreters, since a module imported by an earlier test would hide a leak.
"""

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules(package: str) -> list[str]:
    return sorted(
        f"{package}.{m.name}"
        for m in pkgutil.iter_modules([str(ROOT / package)])
        if m.name != "__main__"
    )


def _imported_after(modules: list[str]) -> set[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert p.returncode == 0, p.stderr
    return set(json.loads(p.stdout.strip().splitlines()[-1]))


def _top(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


def test_rcpflow_imports_neither_airflow_nor_jax():
    loaded = _top(_imported_after(_modules("rcpflow")))
    assert not loaded & {"airflow", "jax", "flax", "optax", "orbax", "tasks", "tpu_jobs"}


def test_tpu_jobs_never_imports_airflow():
    loaded = _top(_imported_after(_modules("tpu_jobs")))
    assert not loaded & {"airflow", "tasks", "dags", "plugins"}


def test_tasks_never_import_jax():
    loaded = _top(_imported_after(_modules("tasks")))
    assert not loaded & {"jax", "flax", "optax", "orbax", "tpu_jobs"}
