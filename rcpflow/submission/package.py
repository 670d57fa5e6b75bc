"""Package N runs as an MLPerf Training submission folder, as the official package checker and
result summarizer read it:

    <org>/results/<system>/qwen35_397b_grpo/result_<i>.txt   each run's MLLOG, byte for byte
    <org>/systems/<system>.json                              the system description
    <org>/benchmarks/qwen35_397b_grpo/                       README (+ the implementation's code)

Every system-description value is a string (docs/design.md, the checkers). Packaging the same
runs again gives the same bytes and removes result files left by an earlier, larger set.
"""

from __future__ import annotations

import json
import os
import platform
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from importlib import metadata

from rcpflow import recipe
from rcpflow.files.layout import RunLayout, is_gcs, join
from rcpflow.files.storage import storage_for
from rcpflow.recipe import DIVISIONS
from rcpflow.records.mllog import read_events

# `status` values the 6.1.0 system description checker accepts for training.
STATUSES = (
    "Available on-premise",
    "Available cloud",
    "Research, Development, or Internal (RDI)",
    "Preview",
)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # matched whole (fullmatch)
# Fields the result summarizer converts with int(); accelerators may be 0 (a CPU-only system).
_COUNT_FIELDS = {
    "number_of_nodes": 1,
    "host_processors_per_node": 1,
    "host_processor_core_count": 1,
    "accelerators_per_node": 0,
}
_MAY_BE_EMPTY = frozenset({"hw_notes", "sw_notes"})
# SystemDescription field -> the MLLOG key it must agree with.
_FROM_RUNS = {"division": "submission_division", "submitter": "submission_org"}


@dataclass(frozen=True)
class SystemDescription:
    """``systems/<system_name>.json``. `division` and `submitter` None mean "as the runs' logs
    declare" (``submission_division``, ``submission_org``).

    Defaults describe a single machine of unknown make; `local_system()` fills in what this
    host can tell about itself.
    """

    system_name: str = "rcpflow-local-cpu"
    submitter: str | None = None
    division: str | None = None
    status: str = "Research, Development, or Internal (RDI)"
    number_of_nodes: str = "1"
    host_processors_per_node: str = "1"
    host_processor_model_name: str = "unknown"
    host_processor_core_count: str = "1"
    host_processor_vcpu_count: str = "1"
    host_processor_frequency: str = "N/A"
    host_processor_caches: str = "N/A"
    host_processor_interconnect: str = "N/A"
    host_memory_capacity: str = "N/A"
    host_storage_type: str = "N/A"
    host_storage_capacity: str = "N/A"
    host_networking: str = "N/A"
    host_networking_topology: str = "N/A"
    host_memory_configuration: str = "N/A"
    accelerators_per_node: str = "0"
    accelerator_model_name: str = "N/A (CPU only)"
    accelerator_host_interconnect: str = "N/A"
    accelerator_frequency: str = "N/A"
    accelerator_on_chip_memories: str = "N/A"
    accelerator_memory_configuration: str = "N/A"
    accelerator_memory_capacity: str = "N/A"
    accelerator_interconnect: str = "N/A"
    accelerator_interconnect_topology: str = "N/A"
    cooling: str = "N/A"
    hw_notes: str = ""
    framework: str = "JAX"
    other_software_stack: str = "rcpflow, mlperf-logging"
    operating_system: str = "N/A"
    sw_notes: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _FROM_RUNS and value is None:
                continue
            if not isinstance(value, str):
                raise ValueError(f"system description: {f.name} must be a string, not {value!r}")
            if not value.strip() and f.name not in _MAY_BE_EMPTY:
                raise ValueError(f"system description: {f.name} must not be empty")
        if not _NAME.fullmatch(self.system_name):
            raise ValueError(
                f"system description: system_name {self.system_name!r} names a folder and a "
                "file: use letters, digits, '_', '.', '-'"
            )
        if self.division is not None and self.division not in DIVISIONS:
            raise ValueError(
                f"system description: division must be one of {DIVISIONS}, not {self.division!r}"
            )
        if self.status not in STATUSES:
            raise ValueError(
                f"system description: status must be one of {STATUSES}, not {self.status!r}"
            )
        for name, least in _COUNT_FIELDS.items():
            value = getattr(self, name)
            if not value.isdigit() or int(value) < least:
                raise ValueError(
                    f"system description: {name} must be a whole number >= {least}, not {value!r}"
                )

    def to_json(self) -> str:
        """The checker's field names (``accelerator_on-chip_memories`` has a hyphen)."""
        for name in _FROM_RUNS:
            if getattr(self, name) is None:
                raise ValueError(f"system description: {name} is not set")
        d = {_json_name(f.name): getattr(self, f.name) for f in fields(self)}
        return json.dumps(d, indent=2) + "\n"


def _json_name(field_name: str) -> str:
    return (
        "accelerator_on-chip_memories"
        if field_name == "accelerator_on_chip_memories"
        else (field_name)
    )


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory() -> str:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return "N/A"
    return f"{round(total / 2**30)} GiB"


def _versions(packages: Sequence[str]) -> str:
    found = []
    for name in packages:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found) or "N/A"


def local_system(**overrides: str | None) -> SystemDescription:
    """This host as a one-node, CPU-only system (what the local demo really runs on)."""
    cores = str(os.cpu_count() or 1)
    facts: dict[str, str | None] = {
        "host_processor_model_name": _cpu_model(),
        "host_processor_core_count": cores,
        "host_processor_vcpu_count": cores,
        "host_memory_capacity": _memory(),
        "framework": _versions(["jax", "flax", "optax"]),
        "other_software_stack": _versions(
            ["rcpflow", "mlperf-logging", "orbax-checkpoint", "apache-airflow"]
        ),
        "operating_system": f"{platform.system()} {platform.release()}",
        "sw_notes": f"Python {platform.python_version()}",
    }
    return SystemDescription(**{**facts, **overrides})  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Run:
    run_dir: str
    seed: int  # the run's seed index: the N of the seed_<N>.out packaged
    log_path: str
    division: str
    org: str
    # The seed the log states: the index for rcpflow's trainers; NeMo-RL's launcher draws its
    # own at random (2115446333 and the like). The package checker's seed check is on this one.
    logged_seed: int


def _read_run(run_dir: str, seed: int) -> _Run:
    log_path = RunLayout(run_dir).mllog(seed)
    if not storage_for(log_path).exists(log_path):
        raise FileNotFoundError(f"run {run_dir}: no MLLOG for seed {seed} at {log_path}")
    events = read_events(log_path)

    def one(key: str) -> object:
        values = [e.value for e in events if e.key == key]
        if len(values) != 1:
            raise ValueError(f"run {run_dir}: {log_path} has {len(values)} {key!r} events, not 1")
        return values[0]

    if one("submission_benchmark") != recipe.BENCHMARK:
        raise ValueError(
            f"run {run_dir}: submission_benchmark is {one('submission_benchmark')!r}, "
            f"not {recipe.BENCHMARK!r}"
        )
    logged = one("seed")
    if isinstance(logged, bool) or not isinstance(logged, int):
        raise ValueError(f"run {run_dir}: {log_path}: seed {logged!r} is not an integer")
    division = one("submission_division")
    if division not in DIVISIONS:
        raise ValueError(
            f"run {run_dir}: submission_division {division!r} is not one of {DIVISIONS}"
        )
    return _Run(run_dir, seed, log_path, str(division), str(one("submission_org")), logged)


def _check_logged_seeds(runs: Sequence[_Run]) -> None:
    """Each run's logged seed its own: the one a trainer drew itself (NeMo-RL) is accepted as
    it is, and recorded beside the index in the package's README; one logged by two runs is
    refused, naming both logs (the package checker's seed check would fail on it)."""
    by_seed: dict[int, list[_Run]] = {}
    for r in runs:
        by_seed.setdefault(r.logged_seed, []).append(r)
    for logged, same in sorted(by_seed.items()):
        if len(same) > 1:
            raise ValueError(
                f"seeds: the logs of {len(same)} runs state seed {logged} ("
                + ", ".join(r.log_path for r in same)
                + "): each run needs its own"
            )


def _agreed(runs: Sequence[_Run], what: str, get: Callable[[_Run], str]) -> str:
    values = {get(r) for r in runs}
    if len(values) != 1:
        raise ValueError(
            f"{what}: the runs disagree: " + ", ".join(f"{r.run_dir} says {get(r)!r}" for r in runs)
        )
    return values.pop()


def _readme(runs: Sequence[_Run], system: SystemDescription) -> str:
    lines = [
        f"# {recipe.BENCHMARK} (MLPerf Training {recipe.RULESET}), {system.division} division",
        "",
        "Packaged by rcpflow. Each result file is the MLLOG of one run, byte for byte:",
        "",
        *(
            f"- result_{i}.txt: seed {r.seed}"
            + (f" (its log states seed {r.logged_seed})" if r.logged_seed != r.seed else "")
            + f", {r.log_path}"
            for i, r in enumerate(runs)
        ),
        "",
    ]
    return "\n".join(lines)


def _code_files(code_dir: str) -> list[tuple[str, str]]:
    """(source, path relative to code_dir) of the files of a local source tree, sorted."""
    found = []
    for dirpath, dirnames, files in os.walk(code_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or name.endswith((".pyc", ".pyo")):
                continue
            src = os.path.join(dirpath, name)
            found.append((src, os.path.relpath(src, code_dir)))
    return found


def package_submission(
    run_dirs: Sequence[str],
    seeds: Sequence[int],
    out_dir: str,
    system: SystemDescription | None = None,
    division: str | None = None,
    code_dirs: Sequence[str] = (),
) -> str:
    """Write ``out_dir/submission`` for these runs (run i is ``run_dirs[i]`` with ``seeds[i]``)
    and return that folder. `division` and ``system.division`` default to the one the runs'
    logs declare and must agree with it; so does ``system.submitter`` (``submission_org``).
    `code_dirs` (local source trees) are copied to
    ``benchmarks/qwen35_397b_grpo/implementations/<folder name>/``."""
    if not run_dirs:
        raise ValueError("run_dirs: no runs to package")
    if len(seeds) != len(run_dirs):
        raise ValueError(f"seeds: {len(seeds)} seeds for {len(run_dirs)} run_dirs")
    repeated = sorted({s for s in seeds if list(seeds).count(s) > 1})
    if repeated:
        raise ValueError(f"seeds: {repeated} used by more than one run (each run needs its own)")
    system = system or SystemDescription()
    runs = [_read_run(d, s) for d, s in zip(run_dirs, seeds, strict=True)]
    _check_logged_seeds(runs)
    declared = {
        "division": _agreed(runs, "division", lambda r: r.division),
        "submitter": _agreed(runs, "submitter (submission_org)", lambda r: r.org),
    }
    given = [
        ("division", division, "division"),
        ("system.division", system.division, "division"),
        ("system.submitter", system.submitter, "submitter"),
    ]
    for what, value, field_name in given:
        if value is not None and value != declared[field_name]:
            raise ValueError(f"{what}: {value!r}, but the runs' logs say {declared[field_name]!r}")
    system = replace(system, **declared)

    org = join(out_dir, "submission")
    storage = storage_for(org)
    results = join(org, "results", system.system_name, recipe.BENCHMARK)
    wanted = {join(results, f"result_{i}.txt"): r for i, r in enumerate(runs)}
    for existing in storage.list(results):
        if re.fullmatch(r"result_.*\.txt", os.path.basename(existing)) and existing not in wanted:
            storage.delete(existing)
    for path, run in wanted.items():
        storage.write_atomic(path, storage_for(run.log_path).read_bytes(run.log_path))
    storage.write_atomic(
        join(org, "systems", f"{system.system_name}.json"), system.to_json().encode()
    )
    bench = join(org, "benchmarks", recipe.BENCHMARK)
    storage.write_atomic(join(bench, "README.md"), _readme(runs, system).encode())
    for code_dir in code_dirs:
        if is_gcs(code_dir) or not os.path.isdir(code_dir):
            raise ValueError(f"code_dirs: {code_dir!r} is not a local folder")
        impl = join(bench, "implementations", os.path.basename(os.path.abspath(code_dir)))
        copies = {join(impl, *rel.split(os.sep)): src for src, rel in _code_files(code_dir)}
        for existing in storage.list(impl):
            if existing not in copies:
                storage.delete(existing)
        for dst, src in copies.items():
            with open(src, "rb") as f:
                storage.write_atomic(dst, f.read())
    return org
