"""docker/ stays consistent with the repository (no docker engine here to build the images):
what the Dockerfiles COPY exists and is not ignored, every pip install is pinned by
constraints.txt and names extras that pyproject.toml defines, the Python version matches, the
job image's entry-point modules exist, the Airflow image points Airflow at the copied dags/ and
plugins/ (the example GKE deployment file is checked in
tests/tasks/backends/gke/test_gke_settings.py)."""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from devtools.servers.container_images import dockerfile_instructions

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DOCKERFILES = ["Dockerfile.tpu", "Dockerfile.airflow"]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for i, line in enumerate((REPO / "constraints.txt").read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert match, f"constraints.txt line {i}: {line!r} is not name==version"
        pins[_normalize(match[1])] = match[2]
    return pins


def _ignored(dockerfile: Path) -> list[str]:
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    assert ignore.is_file(), f"{ignore} missing: the build context would include .venv"
    return [
        ln.strip().rstrip("/")
        for ln in ignore.read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copied_sources_exist_and_are_not_ignored(name: str) -> None:
    dockerfile = DOCKER / name
    ignored = _ignored(dockerfile)
    assert ".venv" in ignored and ".git" in ignored
    copies = [args for op, args in dockerfile_instructions(dockerfile) if op == "COPY"]
    assert copies
    for args in copies:
        *sources, _dest = [a for a in shlex.split(args) if not a.startswith("--")]
        for source in sources:
            path = REPO / source.rstrip("/")
            assert path.exists(), f"{name}: COPY {source}: no such path in the repository"
            for pattern in ignored:
                assert not fnmatch.fnmatch(source.rstrip("/"), pattern), (
                    f"{name}: COPY {source} is excluded by the .dockerignore pattern {pattern!r}"
                )


@pytest.mark.parametrize("name", DOCKERFILES)
def test_pip_installs_are_pinned_and_name_real_extras(name: str) -> None:
    pins = _pins()
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    copied: set[str] = set()
    installs = 0
    for op, args in dockerfile_instructions(DOCKER / name):
        if op == "COPY":
            copied.update(Path(a).name for a in shlex.split(args)[:-1])
        if op != "RUN" or "pip install" not in args:
            continue
        for command in args.split("&&"):
            words = shlex.split(command)
            if words[:2] != ["pip", "install"]:
                continue
            installs += 1
            assert "-c" in words and words[words.index("-c") + 1] == "constraints.txt", (
                f"{name}: {command.strip()!r} is not pinned by -c constraints.txt"
            )
            assert "constraints.txt" in copied, f"{name}: constraints.txt used before COPY"
            for word in words[2:]:
                if word.startswith("-") or word == "constraints.txt":
                    continue
                requirement = re.fullmatch(r"([^\[\]=<>!~ ]+)(?:\[([^\]]+)\])?", word)
                assert requirement, f"{name}: cannot read requirement {word!r}"
                if requirement[1] == ".":
                    for extra in filter(None, (requirement[2] or "").split(",")):
                        assert extra.strip() in extras, (
                            f"{name}: extra {extra!r} is not in pyproject.toml ({sorted(extras)})"
                        )
                else:
                    assert _normalize(requirement[1]) in pins, (
                        f"{name}: {requirement[1]} is installed but not pinned in constraints.txt"
                    )
    assert installs, f"{name}: no pip install"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_base_python_matches_pyproject(name: str) -> None:
    [base] = [args for op, args in dockerfile_instructions(DOCKER / name) if op == "FROM"]
    version = re.search(r"python:?(3\.\d+)", base)
    assert version, f"{name}: FROM {base} does not name a Python version"
    assert f">={version[1]}" in PYPROJECT["project"]["requires-python"], base


def test_constraints_pin_no_local_project() -> None:
    text = (REPO / "constraints.txt").read_text()
    assert "rcpflow" not in _pins()
    assert not re.search(r"^\s*-e\b|file:|@\s", text, re.MULTILINE), "local paths break builds"
    assert _pins()["jax"] == _pins()["jaxlib"], "jax[tpu] needs jaxlib at jax's version"


def test_job_image_entry_points_exist() -> None:
    text = (DOCKER / "Dockerfile.tpu").read_text()
    modules = set(re.findall(r"python -m ([A-Za-z_][\w.]*)", text))
    assert {"tpu_jobs.train", "tpu_jobs.evaluate"} <= modules
    for module in modules:
        base = REPO.joinpath(*module.split("."))
        assert base.with_suffix(".py").is_file() or (base / "__main__.py").is_file(), (
            f"Dockerfile.tpu names python -m {module}, which is not in the repository"
        )


def test_airflow_image_points_airflow_at_the_copied_folders() -> None:
    instructions = dockerfile_instructions(DOCKER / "Dockerfile.airflow")
    [workdir] = [args for op, args in instructions if op == "WORKDIR"]
    env = dict(
        re.findall(r"(\w+)=(\S+)", " ".join(args for op, args in instructions if op == "ENV"))
    )
    destinations = {}
    for op, args in instructions:
        if op == "COPY":
            *sources, dest = shlex.split(args)
            for source in sources:
                destinations[source.rstrip("/")] = str(Path(workdir) / dest.rstrip("/"))
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == destinations["dags"]
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == destinations["plugins"]
    assert "tasks" in destinations and "rcpflow" in destinations
    assert env["RCPFLOW_DEPLOYMENT"].endswith(".toml")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_images_leave_the_developer_tools_out(name: str) -> None:
    assert "devtools" in _ignored(DOCKER / name)
    assert (REPO / "devtools" / "demo.py").is_file()  # what the pattern names exists
    copied = {
        source.rstrip("/")
        for op, args in dockerfile_instructions(DOCKER / name)
        if op == "COPY"
        for source in shlex.split(args)[:-1]
    }
    assert copied, f"{name} copies nothing?"
    assert [s for s in copied if s == "devtools" or s.startswith(("devtools/", "."))] == []


def test_job_image_runs_the_default_job_commands() -> None:
    from tasks.jobs.command import EVALUATE_JOB, TRAIN_JOB

    text = (DOCKER / "Dockerfile.tpu").read_text()
    for command in (TRAIN_JOB, EVALUATE_JOB):
        assert command.argv[1] == "-m" and f"python -m {command.argv[2]}" in text
