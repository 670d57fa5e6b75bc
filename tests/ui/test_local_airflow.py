"""The local Airflow of the demo and `make ui` (`devtools.servers.airflow_server`): every port it
opens is chosen free and bound to 127.0.0.1, so two of them on one machine do not collide.

The listening sockets are read from the operating system (psutil, which Airflow itself
depends on), per process of each Airflow: its components and all their descendants.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from devtools.demo import arguments
from devtools.servers.airflow_server import COMPONENTS, LocalAirflow, ServerConfig
from tasks.jobs.processes import descendants, free_port

REPO = Path(__file__).resolve().parents[2]


def _listening(airflow: LocalAirflow) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket a process of `airflow` listens on."""
    roots = [p.pid for p in airflow.processes.values()]
    pids = set(roots) | descendants(roots)
    found = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            found.add((conn.laddr.ip, conn.laddr.port))
    return found


def _config(home: Path) -> ServerConfig:
    return ServerConfig(
        home=home,
        dags_folder=REPO / "dags",
        plugins_folder=REPO / "plugins",
        port=free_port(),
        parallelism=1,
        env={"JAX_PLATFORMS": "cpu"},
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_local_airflows_listen_on_loopback_at_different_free_ports(tmp_path: Path) -> None:
    with (
        LocalAirflow(_config(tmp_path / "a")) as first,
        LocalAirflow(_config(tmp_path / "b")) as second,
    ):
        first.wait_healthy(120)  # the first is still healthy with the second beside it
        second.wait_healthy(120)
        assert set(first.processes) == set(second.processes) == set(COMPONENTS)
        for airflow in (first, second):
            assert all(p.poll() is None for p in airflow.processes.values())
        a, b = _listening(first), _listening(second)
        assert {ip for ip, _ in a | b} == {"127.0.0.1"}, (a, b)
        assert {(("127.0.0.1", first.config.port)), ("127.0.0.1", first.config.log_port)} <= a
        assert {("127.0.0.1", second.config.port), ("127.0.0.1", second.config.log_port)} <= b
        assert not {port for _, port in a} & {port for _, port in b}
        # Airflow's own fixed log-server ports are not taken
        assert not {port for _, port in a | b} & {8793, 8794}
        # the execution API was built by the start's own request, before any task's
        for airflow in (first, second):
            log = airflow.log_file("api-server").read_text()
            assert "path=/execution/health " in log, log[-2000:]
    for airflow in (first, second):
        assert all(p.poll() is not None for p in airflow.processes.values())


def test_airflow_server_is_a_command_with_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devtools.servers.airflow_server", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--home" in result.stdout and "Ctrl-C" in result.stdout


def test_demo_help_describes_every_option() -> None:
    actions = [a for a in arguments()._actions if a.dest != "help"]
    assert {a.dest for a in actions} >= {"seeds", "trainer", "keep_running", "ui_only"}
    assert all(a.help for a in actions), [a.dest for a in actions if not a.help]
    text = arguments().format_help()
    assert "until Ctrl-C" in text and "make ui" in text
