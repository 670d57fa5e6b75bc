"""The import arrows point one way: dags -> tasks -> rcpflow <- tpu_jobs, plugins -> tasks, and
the developer tools on top (devtools -> tasks, tpu_jobs, rcpflow; nothing imports devtools).

Read statically with `ast`, so an import inside a function or under ``TYPE_CHECKING`` counts as
much as one at the top of a module: a run-time check of ``sys.modules`` cannot see the former,
and that is where import circles hide. Also: no circle between any two project modules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("rcpflow", "tpu_jobs", "tasks", "dags", "plugins", "devtools")
# The product: what the package and the images ship; none of it may import the developer tools.
PRODUCT = ("rcpflow", "tpu_jobs", "tasks", "dags", "plugins")

# Which project layers each layer may import (itself always).
ALLOWED: Mapping[str, frozenset[str]] = {
    "rcpflow": frozenset(),
    "tpu_jobs": frozenset({"rcpflow"}),
    "tasks": frozenset({"rcpflow"}),
    "dags": frozenset({"tasks", "rcpflow"}),
    "plugins": frozenset({"tasks", "rcpflow"}),
    # the demo, the local servers and the benches of both sides; no DAG or plugin module
    "devtools": frozenset({"tasks", "tpu_jobs", "rcpflow"}),
}
_ACCELERATOR = frozenset(
    {"jax", "jaxlib", "flax", "optax", "orbax", "tensorstore", "tunix", "maxtext"}
)
# Third-party packages a layer must never import, anywhere in its code.
FORBIDDEN: Mapping[str, frozenset[str]] = {
    "rcpflow": _ACCELERATOR | {"airflow", "kubernetes", "kubernetes_asyncio"},
    "tpu_jobs": frozenset({"airflow"}),
    "tasks": _ACCELERATOR,
    "dags": _ACCELERATOR,
    "plugins": _ACCELERATOR,
    # the trainers' benches need JAX, the local Airflow the other side: both run from here
    "devtools": frozenset(),
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the module it names (a project module when one matches)
    line: int


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path, layers: Iterable[str] = LAYERS) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for layer in layers:
        for path in sorted((root / layer).rglob("*.py")):
            found[module_name(root, path)] = path
    return found


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    # `from . import x` in a package's __init__ is relative to the package itself
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(module: str, path: Path, known: Iterable[str]) -> list[Import]:
    known = set(known)
    is_package = path.name == "__init__.py"
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node)
            for alias in node.names:
                # `from pkg import sub` imports the submodule when there is one
                sub = f"{base}.{alias.name}"
                found.append(Import(module, sub if sub in known else base, node.lineno))
    return found


def all_imports(root: Path, layers: Iterable[str] = LAYERS) -> list[Import]:
    modules = project_modules(root, layers)
    return [i for m, p in modules.items() for i in imports_of(m, p, modules)]


def arrow_violations(imports: Iterable[Import], modules: Iterable[str]) -> list[str]:
    modules = set(modules)
    bad = []
    for imp in imports:
        layer = imp.module.split(".")[0]
        top = imp.target.split(".")[0]
        if top in LAYERS and top != layer and top not in ALLOWED[layer]:
            bad.append(f"{imp.module}:{imp.line} imports {imp.target} ({layer} -> {top})")
        if top in FORBIDDEN[layer]:
            bad.append(f"{imp.module}:{imp.line} imports {imp.target} ({layer} must not)")
        if top in LAYERS and imp.target not in modules:
            bad.append(f"{imp.module}:{imp.line} imports {imp.target}, which does not exist")
    return bad


def circles(imports: Iterable[Import], modules: Iterable[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), and self-imports."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in imports:
        if imp.target in graph:
            graph[imp.module].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_import_follows_the_arrows() -> None:
    modules = project_modules(ROOT)
    assert "rcpflow.records.manifest" in modules and any(m.startswith("dags.") for m in modules)
    assert arrow_violations(all_imports(ROOT), modules) == []


def test_no_import_circle_between_project_modules() -> None:
    modules = project_modules(ROOT)
    assert circles(all_imports(ROOT), modules) == []


# ---- the checker itself sees what a run-time check would miss ---------------------------------


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    """A package tree: `files` (name -> text), and an empty ``__init__.py`` in every folder
    that `files` gives none."""
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for name in files:
        for folder in (tmp_path / name).relative_to(tmp_path).parents[:-1]:
            (tmp_path / folder / "__init__.py").touch()
    return tmp_path


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tasks/report.py": "from tasks.submission import Spec\n",
            "tasks/submission.py": "class Spec: ...\ndef f():\n    from tasks import report\n",
        },
    )
    modules = project_modules(root, ["tasks"])
    assert circles(all_imports(root, ["tasks"]), modules) == [["tasks.report", "tasks.submission"]]


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"rcpflow/a.py": "def f():\n    import airflow.sdk\n"},
            "rcpflow.a:2 imports airflow.sdk (rcpflow must not)",
        ),
        (
            {
                "rcpflow/a.py": "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from tasks.x import Y\n",
                "tasks/x.py": "Y = 1\n",
            },
            "rcpflow.a:3 imports tasks.x (rcpflow -> tasks)",
        ),
        (
            {
                "tasks/a.py": "from . import b\n",
                "tasks/b.py": "import jax\n",
            },
            "tasks.b:1 imports jax (tasks must not)",
        ),
        (
            {"plugins/p.py": "from tpu_jobs.train import main\n"},
            "plugins.p:1 imports tpu_jobs.train (plugins -> tpu_jobs)",
        ),
    ],
)
def test_arrows_against_the_layering_are_found(
    tmp_path: Path, files: Mapping[str, str], expected: str
) -> None:
    root = _tree(tmp_path, files)
    layers = sorted({name.split("/")[0] for name in files})
    violations = arrow_violations(all_imports(root, layers), project_modules(root, layers))
    assert expected in violations


def test_relative_imports_resolve(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tasks/__init__.py": "from . import run\n",
            "tasks/run/__init__.py": "from .spec import RunSpec\n",
            "tasks/run/spec.py": "from ..run import gate\nRunSpec = 1\n",
            "tasks/run/gate.py": "",
        },
    )
    targets = {(i.module, i.target) for i in all_imports(root, ["tasks"])}
    assert targets == {
        ("tasks", "tasks.run"),
        ("tasks.run", "tasks.run.spec"),
        ("tasks.run.spec", "tasks.run.gate"),
    }


# ---- inside rcpflow/: sub-packages by role, lower ones never import higher ones --------------

# The levels of rcpflow/, lowest first (a module matches its longest listed prefix; a module may
# import its own level or a lower one). The recipe and the file layer know nothing of records;
# records know no verdict; the verdict knows no retention, trainer, submission or CLI (retention
# acts on a verdict); the CLI is on top.
RCPFLOW_LEVELS: tuple[tuple[str, ...], ...] = (
    ("rcpflow.recipe",),
    ("rcpflow.files",),
    ("rcpflow.records",),
    ("rcpflow.verdict", "rcpflow.submission", "rcpflow.planning"),
    ("rcpflow.retention",),
    ("rcpflow.trainer",),
    ("rcpflow.recorder", "rcpflow.cli"),
    ("rcpflow.__main__",),
)  # fmt: skip
# At most this many modules at rcpflow's top level (issue 25): the rest live in sub-packages.
RCPFLOW_TOP_LEVEL_MAX = 10


def test_rcpflow_keeps_a_short_top_level() -> None:
    top = sorted(p.name for p in (ROOT / "rcpflow").iterdir() if p.suffix == ".py")
    assert len(top) <= RCPFLOW_TOP_LEVEL_MAX, top


def test_an_arrow_up_inside_rcpflow_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "rcpflow/records/manifest.py": "from rcpflow.verdict.finalize import decide\n",
            "rcpflow/verdict/finalize.py": "decide = 1\n",
        },
    )
    found = upward_arrows(all_imports(root, ["rcpflow"]), RCPFLOW_LEVELS, "rcpflow")
    assert "rcpflow.records.manifest:1 imports rcpflow.verdict.finalize (level 2 -> 3)" in found


# ---- inside tasks/: lower modules never import higher ones ------------------------------------

# The levels of tasks/, lowest first. A module may import modules of its own level or of a lower
# one, never of a higher one; so the driver protocol and the one lifecycle (tasks.backend_api)
# import no backend, a backend (a driver) never the run that calls it (tasks.run), and the jobs
# and the deployment know no backend. A module matches the longest prefix listed.
TASKS_LEVELS: tuple[tuple[str, ...], ...] = (
    ("tasks.settings", "tasks.names", "tasks.results"),
    ("tasks.jobs",),
    ("tasks.deployment", "tasks.executor_rule"),
    ("tasks.backend_api",),
    ("tasks.backends",),
    ("tasks.backends.registry",),
    ("tasks.run",),
    ("tasks.views",),
    ("tasks.submission",),
)  # fmt: skip


def level_of(module: str, levels: tuple[tuple[str, ...], ...]) -> int | None:
    """The level of a module in a level table (its longest listed prefix), None when none is."""
    best: tuple[int, int] | None = None  # (prefix length, level)
    for level, prefixes in enumerate(levels):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), level)
    return None if best is None else best[1]


def tasks_level(module: str) -> int | None:
    return level_of(module, TASKS_LEVELS)


def upward_arrows(
    imports: Iterable[Import],
    levels: tuple[tuple[str, ...], ...] = TASKS_LEVELS,
    layer: str = "tasks",
) -> list[str]:
    bad = []
    for imp in imports:
        if not (imp.module.startswith(layer + ".") and imp.target.startswith(layer + ".")):
            continue
        here, there = level_of(imp.module, levels), level_of(imp.target, levels)
        if here is None or there is None:
            bad.append(f"{imp.module}:{imp.line}: no level in the {layer} table for one of the two")
        elif there > here:
            bad.append(f"{imp.module}:{imp.line} imports {imp.target} (level {here} -> {there})")
    return bad


def test_the_backend_protocol_imports_no_backend() -> None:
    imports = [i for i in all_imports(ROOT, ["tasks"]) if i.module == "tasks.backend_api.protocol"]
    assert imports, "tasks.backend_api.protocol imports nothing?"
    assert [i.target for i in imports if i.target.startswith("tasks.backends.")] == []


def test_no_product_layer_imports_the_developer_tools() -> None:
    found = [
        f"{i.module}:{i.line} imports {i.target}"
        for i in all_imports(ROOT, PRODUCT)
        if i.target.split(".")[0] == "devtools"
    ]
    assert found == []


def test_a_product_import_of_the_developer_tools_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tasks/a.py": "def f():\n    from devtools.servers import airflow_server\n",
            "devtools/servers/airflow_server.py": "from tasks import a\n",
        },
    )
    layers = ["tasks", "devtools"]
    violations = arrow_violations(all_imports(root, layers), project_modules(root, layers))
    assert violations == [
        "tasks.a:2 imports devtools.servers.airflow_server (tasks -> devtools)",
    ]


# ---- inside devtools/: the servers and fixtures below the benches, the demo on top ------------

DEVTOOLS_LEVELS: tuple[tuple[str, ...], ...] = (
    ("devtools.synthetic_run", "devtools.servers", "devtools.k8s"),
    ("devtools.bench",),
    ("devtools.demo",),
)  # fmt: skip


@pytest.mark.parametrize(
    ("layer", "levels"),
    [("rcpflow", RCPFLOW_LEVELS), ("tasks", TASKS_LEVELS), ("devtools", DEVTOOLS_LEVELS)],
)
def test_inside_a_layer_no_arrow_points_up(layer: str, levels: tuple[tuple[str, ...], ...]) -> None:
    modules = project_modules(ROOT, [layer])
    unlisted = [m for m in modules if m != layer and level_of(m, levels) is None]
    assert unlisted == []
    assert upward_arrows(all_imports(ROOT, [layer]), levels, layer) == []


def test_the_lifecycle_is_below_every_backend_and_a_backend_below_the_run() -> None:
    """`tasks.backend_api` (the driver protocol and the one lifecycle) is a floor below the
    backends, and a backend (a driver) below `tasks.run`: the run calls the backend, never the
    reverse; the lifecycle finds a driver by its registered name, never by an import."""
    api, backend, run = (
        tasks_level(m) for m in ("tasks.backend_api.job_operator", "tasks.backends.slurm.driver",
                                 "tasks.run.job_nodes")
    )  # fmt: skip
    assert api is not None and backend is not None and run is not None
    assert api < backend < run
    imports = all_imports(ROOT, ["tasks"])
    api_imports = [i.target for i in imports if i.module.startswith("tasks.backend_api")]
    assert [t for t in api_imports if t.startswith(("tasks.backends", "tasks.run"))] == []
    backend_imports = [i.target for i in imports if i.module.startswith("tasks.backends")]
    assert [t for t in backend_imports if t.startswith("tasks.run")] == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {
                "tasks/backend_api/protocol.py": "def f():\n    from tasks.backends import local\n",
                "tasks/backends/local.py": "",
            },
            "tasks.backend_api.protocol:2 imports tasks.backends.local (level 3 -> 4)",
        ),
        (
            {
                "tasks/deployment.py": "from tasks.backends.gke.settings import GkeSettings\n",
                "tasks/backends/gke/settings.py": "GkeSettings = 1\n",
            },
            "tasks.deployment:1 imports tasks.backends.gke.settings (level 2 -> 4)",
        ),
        (
            {
                "tasks/views/storage_index.py": "from tasks.submission.spec import RUN_DAG_ID\n",
                "tasks/submission/spec.py": "RUN_DAG_ID = 1\n",
            },
            "tasks.views.storage_index:1 imports tasks.submission.spec (level 7 -> 8)",
        ),
    ],
)
def test_arrows_up_inside_tasks_are_found(
    tmp_path: Path, files: Mapping[str, str], expected: str
) -> None:
    root = _tree(tmp_path, files)
    assert expected in upward_arrows(all_imports(root, ["tasks"]))


# ---- inside tpu_jobs: the recording library below the trainers and the evaluator --------------

_SHARED_LEAVES = frozenset({"tpu_jobs.task", "tpu_jobs.sampling"})  # the digit task, the sampler
_ENTRY_POINTS = frozenset(
    {"tpu_jobs", "tpu_jobs.train", "tpu_jobs.evaluate", "tpu_jobs.tunix_train"}
    | {"tpu_jobs.tunix_evaluate", "tpu_jobs.launch"}
)
# Which parts of tpu_jobs each part may import (itself always). The recording library imports no
# trainer and no evaluator; the evaluator (shared by both trainers' evaluators) imports no
# trainer; the toy and Tunix import the library and the evaluator, never each other; the
# rehearsal jobs import no other part (they need no JAX). Only the
# entry-point shims import anything, and nothing imports them.
TPU_JOBS_ALLOWED: Mapping[str, frozenset[str]] = {
    "tpu_jobs.rcp": frozenset(),
    "tpu_jobs.task": frozenset(),
    "tpu_jobs.sampling": frozenset(),
    "tpu_jobs.eval": frozenset({"tpu_jobs.rcp"}) | _SHARED_LEAVES,
    "tpu_jobs.toy": frozenset({"tpu_jobs.rcp", "tpu_jobs.eval"}) | _SHARED_LEAVES,
    "tpu_jobs.tunix": frozenset({"tpu_jobs.rcp", "tpu_jobs.eval"}) | _SHARED_LEAVES,
    # MaxText's jobs run in an environment of their own (Python 3.13): the recording library
    # and the evaluation's scoring, never the toy's or Tunix's
    "tpu_jobs.maxtext": frozenset({"tpu_jobs.rcp", "tpu_jobs.eval"}) | _SHARED_LEAVES,
    # the rehearsal jobs run in a CPU image without JAX: rcpflow and the standard library only
    "tpu_jobs.rehearsal": frozenset(),
    **{
        entry: frozenset({"tpu_jobs.rcp", "tpu_jobs.eval", "tpu_jobs.toy", "tpu_jobs.tunix"})
        | _SHARED_LEAVES
        for entry in _ENTRY_POINTS
    },
}


def tpu_jobs_part(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def tpu_jobs_violations(imports: Iterable[Import]) -> list[str]:
    bad = []
    for imp in imports:
        if not (imp.module.startswith("tpu_jobs") and imp.target.startswith("tpu_jobs")):
            continue
        mine, theirs = tpu_jobs_part(imp.module), tpu_jobs_part(imp.target)
        if mine not in TPU_JOBS_ALLOWED:
            bad.append(f"{imp.module}: in no part of tpu_jobs ({sorted(TPU_JOBS_ALLOWED)})")
        elif theirs != mine and theirs not in TPU_JOBS_ALLOWED[mine]:
            bad.append(f"{imp.module}:{imp.line} imports {imp.target} ({mine} -> {theirs})")
    return bad


def test_tpu_jobs_parts_import_downwards_only() -> None:
    imports = all_imports(ROOT, ["tpu_jobs"])
    assert {tpu_jobs_part(i.module) for i in imports} >= {
        "tpu_jobs.rcp",
        "tpu_jobs.eval",
        "tpu_jobs.toy",
        "tpu_jobs.tunix",
    }
    assert tpu_jobs_violations(imports) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "tpu_jobs/rcp/a.py",
            "tpu_jobs.rcp.a:2 imports tpu_jobs.toy.m (tpu_jobs.rcp -> tpu_jobs.toy)",
        ),
        (
            "tpu_jobs/tunix/a.py",
            "tpu_jobs.tunix.a:2 imports tpu_jobs.toy.m (tpu_jobs.tunix -> tpu_jobs.toy)",
        ),
        (
            "tpu_jobs/eval/a.py",
            "tpu_jobs.eval.a:2 imports tpu_jobs.toy.m (tpu_jobs.eval -> tpu_jobs.toy)",
        ),
    ],
)
def test_tpu_jobs_arrows_against_the_parts_are_found(
    tmp_path: Path, source: str, expected: str
) -> None:
    root = _tree(
        tmp_path,
        {
            "tpu_jobs/toy/m.py": "",
            source: "def f() -> None:\n    from tpu_jobs.toy import m\n",
        },
    )
    assert expected in tpu_jobs_violations(all_imports(root, ["tpu_jobs"]))


def test_rehearsal_jobs_import_no_accelerator_package() -> None:
    imports = [
        i for i in all_imports(ROOT, ["tpu_jobs"]) if i.module.startswith("tpu_jobs.rehearsal")
    ]
    assert imports, "no tpu_jobs.rehearsal module found"
    assert [i for i in imports if i.target.split(".")[0] in _ACCELERATOR] == []
