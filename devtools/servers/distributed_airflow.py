"""A distributed Airflow on loopback, as Cloud Composer and the Helm chart run it: the
CeleryExecutor over a Redis broker, PostgreSQL metadata, two schedulers, a dag-processor, two
triggerers, the API server, and Celery workers that share nothing with the rest but what a real
deployment shares.

It is `LocalAirflow` (`devtools.servers.airflow_server`) with more components: its own
`LocalPostgres` and `LocalRedis`, a second scheduler, and one ``airflow celery worker`` per
`WorkerSpec`. Each worker runs in its own mount and PID namespace (``unshare``), as if on a host
of its own: its ``/tmp`` is a private folder, into which only the `shared` folders that lie
under ``/tmp`` are bound back (the run folders' storage, a cluster's shared file system, the
deployment file's folder, and what a worker's image holds: the checkout with its DAG folder and
the virtualenv, `image_folders`, wherever the clone lives), and its AIRFLOW_HOME (logs folder
included) is an empty folder of its own; what lies outside ``/tmp`` it sees as it is, and it
reaches PostgreSQL, Redis and the API server over TCP. Each worker has its own hostname, a
loopback address of its own (127.0.0.2, 127.0.0.3: ``[core] hostname_callable`` reads it), where
its own log server listens, so the API server fetches a task's log from the worker that ran it,
as in production. Killing a worker (`kill`) SIGKILLs its namespace's first process, which takes
every process of the namespace with it: a host lost. Each scheduler has a hostname of its own
too (as on two hosts), which its Job row carries: `scheduler_of` names the one that queued a
task instance. `answering_workers` asks the workers over the broker (Celery's ``inspect ping``,
the Helm chart's worker liveness probe). Every component is stopped by the PID we hold
(`LocalAirflow.stop`), then Redis and PostgreSQL.

A worker whose `WorkerSpec.image` names the Airflow image (docker/Dockerfile.airflow, built by
`container_images.Docker.ensure_image`) runs instead as a container of it, as the Helm chart
runs its workers: ``docker run --network host`` on the caller's private daemon (no bridge: it
reaches the rest over loopback as the namespace workers do) under the image's own init (tini,
PID 1), the image's own rcpflow, DAGs and plugins, uid 50000, its own AIRFLOW_HOME, and bound
into it only the `shared` folders (a deployment file's, a hook's), at their paths; nothing of
this checkout or its venv (`image_worker_args`, `image_worker_env`). Killing it (`kill`) is
``docker kill``: SIGKILL to the container's init, which takes every process of the container
with it (a host lost); it is removed then, and on `stop` (``docker rm -f``), so no container
is left.
Needs root (mounts), ``unshare`` (util-linux), ``redis-server`` and PostgreSQL's server; an
image worker, a started `container_images.Docker` (root too).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devtools.servers.airflow_server import (
    COMPONENTS,
    HOST,
    LOG_SERVER_APP,
    AirflowServerError,
    LocalAirflow,
    ServerConfig,
)
from devtools.servers.postgres_server import LocalPostgres
from devtools.servers.redis_server import LocalRedis
from devtools.servers.redis_server import missing_binary as missing_redis
from tasks.deployment import REPO_ROOT
from tasks.jobs.processes import send_signal

if TYPE_CHECKING:  # the daemon is the caller's: this module never starts one
    from devtools.servers.container_images import Docker

# The environment variable `component_hostname` reads; unset: the host's own loopback.
HOSTNAME_VAR = "RCPFLOW_AIRFLOW_HOSTNAME"
PRIVATE_ROOT = Path("/tmp")  # what each worker gets a private copy of
SCHEDULERS = ("scheduler", "scheduler-2")
# Each scheduler's hostname (nothing connects to it: it tells their Job rows apart).
SCHEDULER_HOSTS = {SCHEDULERS[0]: HOST, SCHEDULERS[1]: "127.0.0.4"}
# Two triggerers, as Composer and the Helm chart run them for availability: triggers move to the
# other when one is lost. Each has its own hostname (its Job row's: `triggerer_of`), where a log
# server of its own serves what it wrote of a deferred task (the API fetches it from there).
TRIGGERERS = ("triggerer", "triggerer-2")
TRIGGERER_HOSTS = {TRIGGERERS[0]: HOST, TRIGGERERS[1]: "127.0.0.5"}
TRIGGERER_LOG_SERVER = "log-server-2"
CELERY_APP = "airflow.providers.celery.executors.celery_executor.app"
# A worker announces itself in its log with this once it consumes its queues (Celery's banner).
_READY = b" ready."
# An image worker's `[core] hostname_callable`: the container's hostname, which `docker run
# --hostname` sets to the worker's loopback address (the image holds no devtools, so not
# `component_hostname`; the Helm chart's workers report their pod's hostname the same way).
IMAGE_HOSTNAME_CALLABLE = "socket.gethostname"
# The Airflow image's init (docker/Dockerfile.airflow's entrypoint: ``tini -- airflow``): an
# image worker runs its shell under it, as PID 1.
IMAGE_INIT = "tini"
# What the image sets itself (its AIRFLOW_HOME, DAG and plugin folders, PATH) or names a path of
# this checkout or of the Airflow home here: never passed into an image worker.
_IMAGE_OWN = frozenset(
    {
        "AIRFLOW_HOME",
        "AIRFLOW__CORE__DAGS_FOLDER",
        "AIRFLOW__CORE__PLUGINS_FOLDER",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
        "PATH",
        "PYTHONPATH",
    }
)


def component_hostname() -> str:
    """The ``[core] hostname_callable`` of the distributed Airflow: a worker's own address,
    127.0.0.1 for the other components (where the main log server listens)."""
    return os.environ.get(HOSTNAME_VAR, HOST)


def missing() -> list[str]:
    """What this machine lacks to run a distributed Airflow, each named (empty: nothing)."""
    found = [name for name in ("unshare", "mount") if shutil.which(name) is None]
    if missing_redis():
        found.append("redis-server")
    if os.geteuid() != 0:
        found.append("root (the workers' private mounts)")
    return found


@dataclass(frozen=True)
class WorkerSpec:
    name: str  # the component's name, and Celery's node name
    host: str  # its hostname: a loopback address of its own, where its log server listens
    queues: tuple[str, ...] = ("default",)
    concurrency: int = 2
    # Extra environment of this worker alone (e.g. a PATH with a test's hook first); for an
    # image worker, its whole environment beyond the Airflow settings (`image_worker_env`).
    env: Mapping[str, str] = field(default_factory=dict)
    # The Airflow image's tag: the worker runs as a container of it (module doc), not in a
    # namespace over this checkout. It runs as uid 50000 (gid 0): the shared folders it reads
    # or writes must let it.
    image: str | None = None


WORKERS = (WorkerSpec("worker-1", "127.0.0.2"), WorkerSpec("worker-2", "127.0.0.3"))


@dataclass(frozen=True)
class DistributedConfig:
    airflow: ServerConfig
    # Folders the workers share with the rest (those under /tmp; the rest they see anyway).
    shared: tuple[Path, ...] = ()
    workers: tuple[WorkerSpec, ...] = WORKERS
    # Extra environment for the Airflow components only (on top of `airflow.env`).
    settings: Mapping[str, str] = field(default_factory=dict)


def image_folders() -> tuple[Path, ...]:
    """What a worker's image holds, as this machine keeps it: the checkout (the DAG folder, the
    code) and the interpreter's environment (the virtualenv, when it lies elsewhere)."""
    found: list[Path] = []
    for folder in (REPO_ROOT.resolve(), Path(sys.prefix).resolve()):
        if not any(folder.is_relative_to(f) for f in found):
            found.append(folder)
    return tuple(found)


def namespace_script(
    private: Path, shared: Sequence[Path], home: Path, host_home: Path, command: str
) -> str:
    """The shell script a worker's namespace runs: bind the shared folders into `private`,
    give it an empty `home` (its own folder laid over the home's path where a shared folder
    holds it, as a checkout under /tmp holds the demo's), lay `private` over /tmp, then run
    `command`."""
    lines = ["set -e"]
    bound = [folder for folder in shared if folder.is_relative_to(PRIVATE_ROOT)]
    for folder in bound:
        target = private / folder.relative_to(PRIVATE_ROOT)
        lines.append(f"mkdir -p {shlex.quote(str(target))}")
        lines.append(f"mount --bind {shlex.quote(str(folder))} {shlex.quote(str(target))}")
    if home.is_relative_to(PRIVATE_ROOT):  # an empty folder in its private /tmp
        target = private / home.relative_to(PRIVATE_ROOT)
        lines.append(f"mkdir -p {shlex.quote(str(target))}")
        if any(home.is_relative_to(folder) for folder in bound):
            lines.append(f"mkdir -p {shlex.quote(str(host_home))}")
            lines.append(f"mount --bind {shlex.quote(str(host_home))} {shlex.quote(str(target))}")
    lines.append(f"mount --rbind {shlex.quote(str(private))} {PRIVATE_ROOT}")
    if not home.is_relative_to(PRIVATE_ROOT):
        # an empty folder of its own laid over the home's path, after /tmp: `private` may lie
        # in the home, which this hides
        lines.append(f"mkdir -p {shlex.quote(str(host_home))}")
        lines.append(f"mount --bind {shlex.quote(str(host_home))} {shlex.quote(str(home))}")
    lines.append(command)
    return "\n".join(lines)


def image_worker_env(
    settings: Mapping[str, str], extra: Mapping[str, str], spec: WorkerSpec
) -> dict[str, str]:
    """The environment of image worker `spec`'s container: the Airflow settings every component
    gets (the ``AIRFLOW*`` variables of `settings`: database, broker, executor, secrets, the
    Execution API's URL, log port, connections), `extra` (the Airflow's own environment: the
    deployment file, a storage emulator's variables) and the spec's `env`, less what the image
    sets itself (`_IMAGE_OWN`); its hostname callable `IMAGE_HOSTNAME_CALLABLE`."""
    env = {k: v for k, v in settings.items() if k.startswith("AIRFLOW") and k not in _IMAGE_OWN}
    env.update((k, v) for k, v in extra.items() if k not in _IMAGE_OWN)
    env.update(spec.env)
    env[HOSTNAME_VAR] = spec.host
    env["AIRFLOW__CORE__HOSTNAME_CALLABLE"] = IMAGE_HOSTNAME_CALLABLE
    return env


def image_worker_args(
    spec: WorkerSpec, container: str, env: Sequence[str], shared: Sequence[Path], log_port: int
) -> list[str]:
    """The ``docker run`` arguments of image worker `spec` as container `container`: the
    variables `env` names taken from the client's environment (no value on a command line),
    each `shared` folder bound at its own path, and the Helm chart's worker command."""
    if spec.image is None:
        raise AirflowServerError(f"worker {spec.name} has no image")
    # Airflow's own log server would bind every interface at the log port, which the host
    # network shares with the other components' log servers: the same app runs on the
    # worker's own address instead, as for the namespace workers. The image's own init (tini,
    # its entrypoint's first word: PID 1, reaping and passing signals on) runs the two, and
    # passes the stop signal to the worker, the shell's `exec`.
    log_server = [
        "python", "-m", "uvicorn", LOG_SERVER_APP, "--factory",
        "--host", spec.host, "--port", str(log_port), "--no-access-log",
    ]  # fmt: skip
    worker = [
        "airflow", "celery", "worker", "--skip-serve-logs",
        "--celery-hostname", f"{spec.name}@{spec.host}",
        "--queues", ",".join(spec.queues), "--concurrency", str(spec.concurrency),
    ]  # fmt: skip
    script = f"{shlex.join(log_server)} &\nexec {shlex.join(worker)}"
    return [
        "run", f"--name={container}", "--pull=never",
        "--network=host", f"--hostname={spec.host}", "--stop-signal=SIGINT",
        *(f"--env={name}" for name in sorted(env)),
        *(f"--volume={folder}:{folder}" for folder in shared),
        f"--entrypoint={IMAGE_INIT}", spec.image, "--", "sh", "-c", script,
    ]  # fmt: skip


class DistributedAirflow(LocalAirflow):
    """``with DistributedAirflow(config) as af: af.trigger(...)``; stops on exit. `docker`: the
    started daemon that runs the image workers (needed only if a worker has an image)."""

    def __init__(self, config: DistributedConfig, docker: Docker | None = None) -> None:
        super().__init__(config.airflow)
        self.distributed = config
        self.workers = {w.name: w for w in config.workers}
        self.docker = docker
        images = [w.name for w in config.workers if w.image is not None]
        if images and docker is None:
            raise AirflowServerError(f"image workers {images} need a Docker daemon")
        self.components = (
            *COMPONENTS,
            SCHEDULERS[1],
            TRIGGERERS[1],
            TRIGGERER_LOG_SERVER,
            *self.workers,
        )
        self.postgres = LocalPostgres("airflow")
        self.redis = LocalRedis()
        self._check_layout()

    def _check_layout(self) -> None:
        home = self.config.home.resolve()
        for folder in self.distributed.shared:
            if home.is_relative_to(folder.resolve()):
                raise AirflowServerError(
                    f"shared folder {folder} holds the Airflow home {home}: the workers' "
                    "homes would not be their own"
                )

    def environment(self) -> dict[str, str]:
        db = self.postgres.sqlalchemy_url()
        return {
            **super().environment(),
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db,
            "AIRFLOW__CELERY__BROKER_URL": self.redis.url,
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{db}",
            # one task at a time per free slot: a worker takes no more than it runs
            "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": f"{__name__}.component_hostname",
            **self.distributed.settings,
        }

    def start(self, timeout_s: float = 240.0) -> None:
        lacking = missing()
        if lacking:
            raise AirflowServerError(f"a distributed Airflow needs: {', '.join(lacking)}")
        self.postgres.start()
        self.redis.start()
        super().start(timeout_s)
        for name in self.workers:
            self.wait_worker(name, timeout_s)

    def worker_root(self, name: str) -> Path:
        """The host folder holding worker `name`'s private /tmp and home."""
        return self.config.home / "workers" / name

    def launch(self, name: str, env: Mapping[str, str]) -> None:
        if name in SCHEDULER_HOSTS:
            env = {**env, HOSTNAME_VAR: SCHEDULER_HOSTS[name]}
        if name in TRIGGERER_HOSTS:
            env = {**env, HOSTNAME_VAR: TRIGGERER_HOSTS[name]}
        spec = self.workers.get(name)
        if spec is not None and spec.image is not None:
            # the client's environment carries the container's values (`image_worker_args`)
            self._remove_container(name)
            container = image_worker_env(env, self.config.env, spec)
            env = {**os.environ, **self._docker().client_env(), **container}
        elif spec is not None:
            env = {**env, **spec.env, HOSTNAME_VAR: spec.host}
            (self.worker_root(name) / "tmp").mkdir(parents=True, exist_ok=True)
            (self.worker_root(name) / "tmp").chmod(0o1777)
        super().launch(name, env)

    def _command(self, component: str) -> list[str]:
        if component in SCHEDULERS:
            return [self._airflow, "scheduler", "--skip-serve-logs"]
        if component in TRIGGERERS:
            return [self._airflow, "triggerer", "--skip-serve-logs"]
        if component == TRIGGERER_LOG_SERVER:
            return [
                sys.executable, "-m", "uvicorn", LOG_SERVER_APP, "--factory",
                "--host", TRIGGERER_HOSTS[TRIGGERERS[1]], "--port", str(self.config.log_port),
                "--no-access-log",
            ]  # fmt: skip
        spec = self.workers.get(component)
        if spec is None:
            return super()._command(component)
        if spec.image is not None:
            env = image_worker_env(self.environment(), self.config.env, spec)
            args = image_worker_args(
                spec,
                self.container(component),
                list(env),
                self.distributed.shared,
                self.config.log_port,
            )
            return self._docker().command(*args)
        log_server = [
            sys.executable, "-m", "uvicorn", LOG_SERVER_APP, "--factory",
            "--host", spec.host, "--port", str(self.config.log_port), "--no-access-log",
        ]  # fmt: skip
        worker = [
            self._airflow, "celery", "worker", "--skip-serve-logs",
            "--celery-hostname", f"{spec.name}@{spec.host}",
            "--queues", ",".join(spec.queues), "--concurrency", str(spec.concurrency),
        ]  # fmt: skip
        # not exec'd: the namespace's first process ignores signals it has no handler for,
        # so the worker is its child, stopped by the SIGINT the whole group gets
        command = f"{shlex.join(log_server)} &\n{shlex.join(worker)}"
        root = self.worker_root(component)
        shared = (*image_folders(), *self.distributed.shared)
        script = namespace_script(root / "tmp", shared, self.config.home, root / "home", command)
        # --kill-child: the namespace's processes end with the one we hold, however it ends
        return [
            "unshare", "--mount", "--propagation", "private", "--pid", "--fork",
            "--mount-proc", "--kill-child", "sh", "-c", script,
        ]  # fmt: skip

    def container(self, name: str) -> str:
        """The container name of image worker `name` (one Airflow per API port here)."""
        return f"rcpflow-airflow-{self.config.port}-{name}"

    def _docker(self) -> Docker:
        if self.docker is None:
            raise AirflowServerError("image workers need a Docker daemon")
        return self.docker

    def _remove_container(self, name: str) -> None:
        """``docker rm -f`` of image worker `name`'s container (SIGKILL if it still runs)."""
        self._docker().client("rm", "--force", self.container(name), check=False)

    def wait_worker(self, name: str, timeout_s: float, offset: int = 0) -> None:
        """Wait until worker `name` consumes its queues: its banner's ``ready.`` in its log
        after `offset`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            with open(self.log_file(name), "rb") as f:
                f.seek(offset)
                if _READY in f.read():
                    return
            time.sleep(0.5)
        raise AirflowServerError(f"Celery worker {name} not ready after {timeout_s}s")

    def triggerer_of(self, job_id: int) -> str:
        """The triggerer (its component name) that runs as the TriggererJob `job_id` (a task
        instance's ``triggerer_job``), told by the Job row's hostname."""
        hostname = self._job_hostname("SELECT hostname FROM job WHERE id = :id", {"id": job_id})
        names = [n for n, host in TRIGGERER_HOSTS.items() if host == hostname]
        if not names:
            raise AirflowServerError(f"triggerer job {job_id} is no triggerer of ours ({hostname})")
        return names[0]

    def scheduler_of(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
        """The scheduler (its component name) that queued the task instance: its
        ``queued_by_job_id``, which the REST API does not show, read from the metadata database
        and told by the Job row's hostname."""
        hostname = self._job_hostname(
            "SELECT job.hostname FROM task_instance ti JOIN job ON job.id = ti.queued_by_job_id"
            " WHERE ti.dag_id = :dag_id AND ti.run_id = :run_id AND ti.task_id = :task_id"
            " AND ti.map_index = :map_index",
            {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "map_index": map_index},
        )
        names = [n for n, host in SCHEDULER_HOSTS.items() if host == hostname]
        if not names:
            raise AirflowServerError(f"{dag_id} {run_id} {task_id}: queued by no scheduler of ours")
        return names[0]

    def _job_hostname(self, query: str, params: Mapping[str, Any]) -> str | None:
        """The one hostname `query` reads from the metadata database (a Job row's)."""
        import sqlalchemy  # Airflow's own dependency; only this developer tool reads the rows

        engine = sqlalchemy.create_engine(self.postgres.sqlalchemy_url())
        try:
            with engine.connect() as conn:
                found = conn.execute(sqlalchemy.text(query), dict(params)).scalar()
        finally:
            engine.dispose()
        return None if found is None else str(found)

    def answering_workers(self, timeout_s: float = 5.0) -> set[str]:
        """The workers (component names) that answer Celery's ping over the broker now."""
        proc = subprocess.run(
            [
                sys.executable, "-m", "celery", "--app", CELERY_APP, "inspect", "ping",
                "--json", "--timeout", str(timeout_s),
            ],
            env=self.environment(), capture_output=True, text=True, timeout=timeout_s + 120,
            check=False,
        )  # fmt: skip
        if proc.returncode != 0:  # no worker answered (Celery says so on stderr)
            return set()
        nodes = json.loads(proc.stdout.strip().splitlines()[-1])
        return {n for n, w in self.workers.items() if f"{n}@{w.host}" in nodes}

    def wait_workers_answer(self, timeout_s: float = 120.0) -> None:
        """Wait until every worker answers Celery's ping (e.g. back on a restarted broker)."""
        deadline = time.monotonic() + timeout_s
        while (answering := self.answering_workers()) != set(self.workers):
            self.check_alive()
            if time.monotonic() > deadline:
                missing = sorted(set(self.workers) - answering)
                raise AirflowServerError(f"workers not answering after {timeout_s}s: {missing}")

    def kill(self, name: str) -> None:
        """SIGKILL component `name` with its process group (a worker: its whole namespace; an
        image worker: its container, ``docker kill``, then removed); it stays down until
        `restart` (and `check_alive` no longer asks after it)."""
        proc = self.processes.pop(name)
        spec = self.workers.get(name)
        if spec is not None and spec.image is not None:
            # SIGKILL to the container's init ends every process in it; the client attached
            # to it (`proc`) ends with it
            self._docker().client("kill", self.container(name), check=False)
            proc.wait(timeout=30)
            self._remove_container(name)
            return
        send_signal(proc.pid, signal.SIGKILL, group=True)
        proc.wait(timeout=30)

    def restart(self, name: str, timeout_s: float = 120.0) -> None:
        """Start component `name` again (after `kill`), waiting for a worker to be ready."""
        size = self.log_file(name).stat().st_size
        self.launch(name, self.environment())
        if name in self.workers:
            self.wait_worker(name, timeout_s, offset=size)

    def stop(self, grace_s: float = 30.0) -> None:
        # `unshare` blocks SIGINT while it waits for its namespace: the worker in it gets the
        # signal through the group (then the namespace ends, and `unshare` with it); an image
        # worker gets it from the daemon (its stop signal), its client ending with it
        images = [n for n, w in self.workers.items() if w.image is not None]
        for name in self.workers:
            proc = self.processes.get(name)
            if proc is None or proc.poll() is not None:
                continue
            if name in images:
                self._docker().client("kill", "--signal=SIGINT", self.container(name), check=False)
            else:
                send_signal(proc.pid, signal.SIGINT, group=True)
        try:
            super().stop(grace_s)
        finally:
            try:
                for name in images:  # what outlived the grace, and every stopped one: removed
                    self._remove_container(name)
            finally:
                self.redis.stop()
                self.postgres.stop()
