"""Fixtures for the Slurm backend's tests: a private Slurm (slurmctld, slurmd ``n1``, ``n2``,
munged, slurmrestd with JWT) and a private sshd standing in for its login node, each started
once per session (`devtools.servers.slurm_cluster`, `devtools.servers.sshd_server`).

Without Debian's packages the tests that need them are skipped, naming what is missing, and
fail when ``CI`` is set (``make test`` installs them: ``make system-packages``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from env_helpers import set_env

from devtools.servers import slurm_cluster, sshd_server
from devtools.servers.slurm_cluster import NodeSpec, SlurmCluster
from devtools.servers.sshd_server import LocalSshd

SSH_CONN_ID = "rcpflow_slurm_login"


def _require(missing: list[str], what: str) -> None:
    if not missing:
        return
    message = f"{what}: not installed: {', '.join(missing)} (make system-packages)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """The private Slurm, with slurmrestd; SLURM_CONF is in its `env` (not os.environ)."""
    _require(slurm_cluster.missing_binaries(rest=True), "a private Slurm")
    cluster = SlurmCluster((NodeSpec("n1", cpus=4), NodeSpec("n2", cpus=4)), rest=True)
    with cluster:
        yield cluster
    cluster.cleanup()


@pytest.fixture
def slurm_env(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The private Slurm, its SLURM_CONF in os.environ for this test (the local transport)."""
    set_env(monkeypatch, slurm.env)
    return slurm


@pytest.fixture
def jobs_dir(slurm: SlurmCluster, tmp_path: Path) -> Path:
    """A folder the jobs may write (root's tmp_path is private to root, as are the jobs)."""
    folder = tmp_path / "jobs"
    folder.mkdir()
    return folder


@pytest.fixture(scope="session")
def login_node(slurm: SlurmCluster) -> Iterator[LocalSshd]:
    """A private sshd whose sessions have the private Slurm's SLURM_CONF (a login node)."""
    _require(sshd_server.missing_binaries(), "a private sshd")
    server = LocalSshd(set_env=slurm.env)
    with server:
        yield server
    server.cleanup()


@pytest.fixture
def ssh_conn(login_node: LocalSshd, monkeypatch: pytest.MonkeyPatch) -> str:
    """An Airflow SSH connection to the login node (an AIRFLOW_CONN_ variable), pinned to
    its host key; its id."""
    conn = {
        "conn_type": "ssh",
        "host": "127.0.0.1",
        "port": login_node.port,
        "login": login_node.user,
        "extra": {
            "key_file": str(login_node.user_key),
            "host_key": login_node.host_public_key,
            "look_for_keys": "false",
        },
    }
    monkeypatch.setenv(f"AIRFLOW_CONN_{SSH_CONN_ID.upper()}", json.dumps(conn))
    return SSH_CONN_ID


@pytest.fixture(autouse=True)
def no_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """The triggers' least time to an event (an Airflow scheduler race, see
    `tasks.backend_api.watch_trigger.SETTLE_S`) is no concern without a scheduler: 0 here, but
    in `test_an_event_waits_for_the_deferral_to_settle`."""
    from tasks.backend_api import watch_trigger

    monkeypatch.setattr(watch_trigger, "SETTLE_S", 0.0)
