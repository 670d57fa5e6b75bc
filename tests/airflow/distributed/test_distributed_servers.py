"""The distributed harness's own parts, without the cluster: a worker namespace's mounts, an
image worker's ``docker run`` and environment, and the private Redis (answers, comes back on its
port after a restart, stopped by PID)."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow_harness import alive

from devtools.servers.distributed_airflow import (
    HOSTNAME_VAR,
    WorkerSpec,
    image_worker_args,
    image_worker_env,
    namespace_script,
)
from devtools.servers.redis_server import LocalRedis, missing_binary


def test_a_worker_sees_the_shared_folders_and_a_home_of_its_own() -> None:
    script = namespace_script(
        Path("/tmp/h/workers/w1/tmp"),
        (Path("/tmp/storage"), Path("/work/runs")),
        Path("/tmp/h/home"),
        Path("/tmp/h/workers/w1/home"),
        "airflow celery worker",
    ).splitlines()
    # a shared folder under /tmp is bound into the private /tmp before it is laid over /tmp;
    # one outside /tmp needs nothing; the home is an empty folder of the private /tmp
    assert script == [
        "set -e",
        "mkdir -p /tmp/h/workers/w1/tmp/storage",
        "mount --bind /tmp/storage /tmp/h/workers/w1/tmp/storage",
        "mkdir -p /tmp/h/workers/w1/tmp/h/home",
        "mount --rbind /tmp/h/workers/w1/tmp /tmp",
        "airflow celery worker",
    ]


def test_a_home_outside_tmp_gets_a_folder_of_its_own_laid_over_it() -> None:
    # the private /tmp lies in the home (as the demo's does): laid over /tmp before the home
    # is hidden
    script = namespace_script(
        Path("/srv/airflow/workers/w1/tmp"),
        (),
        Path("/srv/airflow"),
        Path("/srv/airflow/workers/w1/home"),
        "x",
    )
    assert script.splitlines() == [
        "set -e",
        "mount --rbind /srv/airflow/workers/w1/tmp /tmp",
        "mkdir -p /srv/airflow/workers/w1/home",
        "mount --bind /srv/airflow/workers/w1/home /srv/airflow",
        "x",
    ]


def test_a_checkout_under_tmp_is_bound_and_a_home_inside_it_is_a_folder_of_its_own() -> None:
    """A fresh clone under /tmp (its .venv inside): a worker's private /tmp must not hide the
    code and interpreter its image holds; the demo's home lies in the clone, and the worker
    still gets an empty one of its own over it."""
    script = namespace_script(
        Path("/tmp/clone/.airflow/demo/workers/w1/tmp"),
        (Path("/tmp/clone"),),
        Path("/tmp/clone/.airflow/demo"),
        Path("/tmp/clone/.airflow/demo/workers/w1/home"),
        "x",
    )
    assert script.splitlines() == [
        "set -e",
        "mkdir -p /tmp/clone/.airflow/demo/workers/w1/tmp/clone",
        "mount --bind /tmp/clone /tmp/clone/.airflow/demo/workers/w1/tmp/clone",
        "mkdir -p /tmp/clone/.airflow/demo/workers/w1/tmp/clone/.airflow/demo",
        "mkdir -p /tmp/clone/.airflow/demo/workers/w1/home",
        "mount --bind /tmp/clone/.airflow/demo/workers/w1/home "
        "/tmp/clone/.airflow/demo/workers/w1/tmp/clone/.airflow/demo",
        "mount --rbind /tmp/clone/.airflow/demo/workers/w1/tmp /tmp",
        "x",
    ]


def test_the_image_folders_are_the_checkout_and_the_interpreters_environment() -> None:
    import sys

    from devtools.servers.distributed_airflow import image_folders
    from tasks.deployment import REPO_ROOT

    folders = image_folders()
    assert folders[0] == REPO_ROOT.resolve()
    assert any(Path(sys.prefix).resolve().is_relative_to(f) for f in folders)
    assert len(folders) == len(set(folders)) <= 2


IMAGE_WORKER = WorkerSpec(
    "worker-2", "127.0.0.3", ("default",), 2, {"PYTHONPATH": "/tmp/hooks"}, "rcpflow-airflow:abc"
)


def test_an_image_worker_runs_the_charts_worker_command_on_the_host_network() -> None:
    args = image_worker_args(
        IMAGE_WORKER,
        "rcpflow-airflow-8080-worker-2",
        ["AIRFLOW__CORE__EXECUTOR", "RCPFLOW_DEPLOYMENT"],
        (Path("/tmp/deployment"), Path("/tmp/hooks")),
        8793,
    )
    # host network (no bridge), the worker's loopback address as its hostname, the stop
    # signal Celery's warm shutdown; variables by name only; the shared folders at their paths
    *options, script = args
    assert options == [
        "run",
        "--name=rcpflow-airflow-8080-worker-2",
        "--pull=never",
        "--network=host",
        "--hostname=127.0.0.3",
        "--stop-signal=SIGINT",
        "--env=AIRFLOW__CORE__EXECUTOR",
        "--env=RCPFLOW_DEPLOYMENT",
        "--volume=/tmp/deployment:/tmp/deployment",
        "--volume=/tmp/hooks:/tmp/hooks",
        # the image's init as PID 1 (no docker --init): the shell under it
        "--entrypoint=tini",
        "rcpflow-airflow:abc",
        "--",
        "sh",
        "-c",
    ]
    log_server, worker = script.splitlines()
    assert log_server.endswith(" &") and "--host 127.0.0.3 --port 8793" in log_server
    # the worker is the shell's exec: tini's signals reach it
    assert worker == (
        "exec airflow celery worker --skip-serve-logs --celery-hostname worker-2@127.0.0.3"
        " --queues default --concurrency 2"
    )
    assert not any("/work" in a or ".venv" in a for a in args)  # nothing of a checkout


def test_an_image_workers_environment_is_the_airflow_settings_less_the_images_own() -> None:
    settings = {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": "redis://127.0.0.1:1/0",
        "AIRFLOW__CORE__DAGS_FOLDER": "/work/dags",
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "devtools.servers.distributed_airflow.x",
        "AIRFLOW_HOME": "/tmp/home",
        "AIRFLOW_CONN_GKE": "{}",
        "PATH": "/work/.venv/bin",
        "HOME": "/root",
    }
    extra = {"RCPFLOW_DEPLOYMENT": "/tmp/deployment/d.toml", "PYTHONPATH": "/work"}
    assert image_worker_env(settings, extra, IMAGE_WORKER) == {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": "redis://127.0.0.1:1/0",
        "AIRFLOW_CONN_GKE": "{}",
        "RCPFLOW_DEPLOYMENT": "/tmp/deployment/d.toml",
        "PYTHONPATH": "/tmp/hooks",  # the spec's: the checkout's is never passed
        HOSTNAME_VAR: "127.0.0.3",
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "socket.gethostname",
    }


def test_the_private_redis_restarts_on_its_port_and_stops_by_pid() -> None:
    if missing_binary():
        pytest.skip("redis-server is not installed (make system-packages)")
    with LocalRedis() as redis:
        assert redis.process is not None and redis.answers()
        first, port = redis.process.pid, redis.port
        redis.restart()
        assert redis.process.pid != first and not alive(first)
        assert redis.port == port and redis.answers()
        last = redis.process.pid
    assert not alive(last) and redis.root is None
