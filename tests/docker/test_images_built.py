"""Both images of docker/ built (devtools.servers.container_images: a private dockerd, a Debian
base image made by debootstrap, ``--network host`` for pip) and run: the job image trains the toy
for two steps into a run folder and evaluates its checkpoint, its PID 1 gets the SIGTERM of
``docker stop`` (what a kubelet sends) and both jobs handle it; the Airflow image parses every
DAG with each example deployment, runs ``rcpflow --help`` and has the providers the deployments
of docs/deploy.md need. Jobs run with ``--network none`` (a namespace holding only loopback).

Built from nothing the first time (base image about a minute, the job image about 40 s, the
Airflow image about 4 min: docs/containers.md); later runs find the images by the content hash
of their build contexts and build nothing."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from devtools.servers.container_images import (
    DOCKER_DIR,
    REPO,
    ContainerError,
    Docker,
    build_context,
    is_ignored,
)

pytestmark = pytest.mark.timeout(1800)

DAG_IDS = {"mlperf_grpo_run", "mlperf_grpo_deferred_eval", "mlperf_grpo_submission"}
TRAIN = ["python", "-m", "tpu_jobs.train", "--seed", "1", "--global-batch-size", "16"]
BIG_POLICY = ["--d-model", "1024", "--d-ff", "4096", "--num-layers", "8"]


@pytest.fixture(scope="module")
def docker() -> Iterator[Docker]:
    with Docker() as daemon:
        yield daemon


@pytest.fixture(scope="module")
def job_image(docker: Docker) -> str:
    return docker.ensure_image("tpu")


@pytest.fixture(scope="module")
def airflow_image(docker: Docker) -> str:
    return docker.ensure_image("airflow")


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """The folder mounted at /runs in the job containers."""
    folder = tmp_path / "runs"
    folder.mkdir()
    return folder


def _manifest(run: Path) -> list[dict[str, object]]:
    path = run / "mllog" / "eval_checkpoints.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _exit_code(docker: Docker, name: str) -> int:
    state = json.loads(docker.client("inspect", "-f", "{{json .State}}", name).stdout)
    assert state["Status"] == "exited", state
    assert not state["OOMKilled"], state
    return int(state["ExitCode"])


def _wait(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f}s")
        time.sleep(0.2)


@contextlib.contextmanager
def _detached(docker: Docker, name: str, *argv: str) -> Iterator[str]:
    """``docker run --detach`` of `argv` (no network) as container `name`, removed at the end."""
    docker.client("run", "--detach", f"--name={name}", "--network=none", *argv)
    try:
        yield name
    finally:
        docker.client("rm", "-f", name, check=False)


def _stop_by_sigterm(docker: Docker, name: str) -> float:
    """``docker stop`` (SIGTERM to PID 1, the job's python as in a pod; SIGKILL after 60 s): the
    job exits 143 (its log in the error); the seconds the stop took."""
    started = time.monotonic()
    docker.client("stop", "--time=60", name)
    stopped_s = time.monotonic() - started
    logs = docker.client("logs", name).stdout
    assert _exit_code(docker, name) == 143, logs
    return stopped_s


def test_build_context_is_what_the_ignore_file_leaves(tmp_path: Path) -> None:
    first = build_context("tpu", tmp_path / "a")
    assert first == build_context("tpu", tmp_path / "b")  # same content, same tag
    files = {p.relative_to(tmp_path / "a").as_posix() for p in (tmp_path / "a").rglob("*")}
    assert "Dockerfile" in files and ".dockerignore" in files
    assert any(f.startswith("tpu_jobs/toy/") for f in files)
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)
    assert not any(f.startswith(("tasks/", "devtools/", "tests/", "dags/")) for f in files)
    (tmp_path / "a" / "Dockerfile").write_text("changed")
    assert is_ignored("rcpflow/x/__pycache__/y.pyc", ["**/__pycache__"])
    assert is_ignored("runs/seed_1/a", ["runs"]) and not is_ignored("rcpflow/runs", ["runs"])
    assert not is_ignored("rcpflow/x.egg-info", ["*.egg-info"])  # "*" stays in one element


def test_dockerfiles_pull_no_frontend_image() -> None:
    # "# syntax=docker/dockerfile:1" makes BuildKit pull its frontend from Docker Hub: the build
    # then fails where no registry is reachable (found building here).
    for path in sorted(DOCKER_DIR.glob("Dockerfile.*")):
        if not path.name.endswith(".dockerignore"):
            assert "# syntax=" not in path.read_text(), path.name


def test_job_image_trains_two_steps_and_evaluates(
    docker: Docker, job_image: str, runs: Path
) -> None:
    volume = f"--volume={runs}:/runs"
    train = [*TRAIN, "--run-dir", "/runs/seed_1", "--max-steps", "2", "--val-start-at", "1"]
    out = docker.client("run", "--rm", "--network=none", volume, job_image, *train).stdout
    assert '"event": "done"' in out and '"last_step": 2' in out, out
    assert [row["step"] for row in _manifest(runs / "seed_1")] == [1, 2]
    evaluate = ["python", "-m", "tpu_jobs.evaluate", "--run-dir", "/runs/seed_1", "--step", "2"]
    out = docker.client("run", "--rm", "--network=none", volume, job_image, *evaluate).stdout
    summary = json.loads((runs / "seed_1" / "eval" / "step_2" / "summary.json").read_text())
    assert summary["checkpoint_step"] == 2 and summary["complete"] is True, summary
    assert not (runs / "seed_1" / "eval" / "step_2" / "evaluating.json").exists()
    # the image's own check: its python is the pinned JAX's (CPU here; libtpu is installed)
    versions = docker.client(
        "run", "--rm", "--network=none", job_image, "python", "-c",
        "import jax, libtpu, rcpflow; print(jax.__version__, jax.default_backend())",
    ).stdout  # fmt: skip
    pins = dict(
        line.split("==") for line in (REPO / "constraints.txt").read_text().splitlines()
        if line.startswith("jax==")
    )  # fmt: skip
    assert versions.split() == [pins["jax"], "cpu"], versions


def test_job_image_trainer_stops_on_sigterm_with_its_last_row(
    docker: Docker, job_image: str, runs: Path, tmp_path: Path
) -> None:
    with _detached(
        docker, f"rcpflow-train-{tmp_path.name}", f"--volume={runs}:/runs",
        job_image, *TRAIN, "--run-dir", "/runs/seed_1", "--max-steps", "400",
        "--val-start-at", "1",
    ) as name:  # fmt: skip
        _wait(lambda: len(_manifest(runs / "seed_1")) >= 2, 120, "two manifest rows")
        assert _stop_by_sigterm(docker, name) < 30, "PID 1 did not act on SIGTERM"
    rows = _manifest(runs / "seed_1")
    steps = [int(str(row["step"])) for row in rows]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) < 400
    saved = {int(p.name) for p in (runs / "seed_1" / "checkpoints").iterdir() if p.name.isdigit()}
    assert steps[-1] in saved, (steps, saved)  # the last row names a checkpoint that exists


def test_job_image_evaluator_cancelled_removes_its_in_progress_record(
    docker: Docker, job_image: str, runs: Path, tmp_path: Path
) -> None:
    volume = f"--volume={runs}:/runs"
    # a policy large enough that evaluating its checkpoint takes about 10 s here
    docker.client(
        "run", "--rm", "--network=none", volume, job_image, *TRAIN, "--run-dir", "/runs/seed_1",
        "--max-steps", "1", "--val-start-at", "1", *BIG_POLICY,
    )  # fmt: skip
    evaluating = runs / "seed_1" / "eval" / "step_1" / "evaluating.json"
    with _detached(
        docker, f"rcpflow-eval-{tmp_path.name}", volume, job_image,
        "python", "-m", "tpu_jobs.evaluate", "--run-dir", "/runs/seed_1", "--step", "1",
    ) as name:  # fmt: skip
        _wait(evaluating.exists, 120, "evaluating.json written")
        time.sleep(0.5)
        _stop_by_sigterm(docker, name)
    assert not evaluating.exists(), "the cancelled evaluation left its in-progress record"
    assert not (evaluating.parent / "summary.json").exists()


_DAGBAG = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag("/opt/rcpflow/dags")
print(json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()},
                  "dags": sorted(bag.dags)}))
"""


@pytest.mark.parametrize(
    "deployment",
    [
        "deployment.gke.example.toml",
        "deployment.slurm.example.toml",
        "deployment.rehearsal.toml",
    ],
)
def test_airflow_image_parses_every_dag(
    docker: Docker, airflow_image: str, deployment: str
) -> None:
    mount = f"--volume={DOCKER_DIR / deployment}:/etc/rcpflow/deployment.toml:ro"
    out = docker.client(
        "run", "--rm", "--network=none", mount, "--entrypoint=python", airflow_image,
        "-c", _DAGBAG,
    ).stdout  # fmt: skip
    found = json.loads(out.strip().splitlines()[-1])
    assert found == {"errors": {}, "dags": sorted(DAG_IDS)}


def test_airflow_image_runs_rcpflow_and_has_every_deployments_provider(
    docker: Docker, airflow_image: str
) -> None:
    out = docker.client(
        "run", "--rm", "--network=none", "--entrypoint=rcpflow", airflow_image, "--help"
    ).stdout
    assert "usage: rcpflow" in out, out
    user = docker.client("run", "--rm", "--network=none", "--entrypoint=id", airflow_image)
    assert user.stdout.startswith("uid=50000"), user.stdout
    # AIRFLOW_HOME is the airflow user's, and no airflow.cfg (secret keys) was baked in as root
    home = docker.client(
        "run", "--rm", "--network=none", "--entrypoint=sh", airflow_image, "-c",
        'stat -c %u "$AIRFLOW_HOME"; ls -A "$AIRFLOW_HOME"',
    ).stdout.split()  # fmt: skip
    assert home[0] == "50000" and "airflow.cfg" not in home[1:], home
    providers = docker.client(
        "run", "--rm", "--network=none", airflow_image, "providers", "list", "--output=json"
    ).stdout
    names = {p["package_name"] for p in json.loads(providers[providers.index("[") :])}
    assert {
        "apache-airflow-providers-google",
        "apache-airflow-providers-cncf-kubernetes",
        "apache-airflow-providers-celery",
        "apache-airflow-providers-ssh",
    } <= names, names
    # the Celery worker of the Helm chart and Composer: its executor and Redis broker load
    docker.client(
        "run", "--rm", "--network=none", "--entrypoint=python", airflow_image, "-c",
        "import airflow.providers.celery.executors.celery_executor, redis, psycopg2",
    )  # fmt: skip


def test_airflow_image_runs_its_component_under_an_init(docker: Docker, airflow_image: str) -> None:
    """A component must not be PID 1 (no reaping; SIGTERM ignored without a handler): the
    entrypoint is tini, which runs `airflow` as its child; a command is Airflow's."""
    entrypoint = docker.client(
        "image", "inspect", "--format", "{{json .Config.Entrypoint}}", airflow_image
    ).stdout
    assert json.loads(entrypoint) == ["tini", "--", "airflow"], entrypoint
    out = docker.client("run", "--rm", "--network=none", airflow_image, "version").stdout
    # the image pins Airflow by the same constraints.txt as this venv
    assert out.strip().splitlines()[-1] == metadata.version("apache-airflow"), out
    # tini is PID 1 when it is the entrypoint, and its child sees it as its parent
    pids = docker.client(
        "run", "--rm", "--network=none", "--entrypoint=tini", airflow_image, "--",
        "sh", "-c", 'echo "$$ $PPID $(tr "\\0" " " < /proc/1/cmdline)"',
    ).stdout.split()  # fmt: skip
    assert pids[1:3] == ["1", "tini"], pids


def test_a_failing_docker_command_is_one_line_error(docker: Docker) -> None:
    with pytest.raises(ContainerError, match=r"docker image inspect rcpflow-no-such"):
        docker.client("image", "inspect", "rcpflow-no-such:image")
