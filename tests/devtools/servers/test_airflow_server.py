"""The local Airflow's REST client (`LocalAirflow._request`) through a server that stalls: a
read is asked again, a write never is, a refused connection is no stall; and the settings its
components get.

Each server of devtools/servers is started by the tests that need it: airflow_server by tests/ui/
and tests/airflow/, postgres_server by tests/airflow/test_airflow_scheduler_e2e.py, slurm_cluster
and sshd_server by tests/tasks/backends/slurm/, redis_server and distributed_airflow by
tests/airflow/distributed/."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from devtools.servers import airflow_server
from devtools.servers.airflow_server import LocalAirflow, ServerConfig


class StallingServer:
    """An HTTP server on 127.0.0.1 that leaves its first `stall` connections unanswered (held
    open until it stops) and answers every later one with ``{"state": "running"}``."""

    def __init__(self, stall: int) -> None:
        self.stall = stall
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            head = conn.recv(65536)
            self.requests.append(head.split(b"\r\n", 1)[0])
            if len(self.requests) <= self.stall:
                self._held.append(conn)
                continue
            body = b'{"state": "running"}'
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
            )
            conn.close()

    @contextmanager
    def running(self) -> Iterator[StallingServer]:
        self._thread.start()
        try:
            yield self
        finally:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close does not)
            self.sock.close()
            for conn in self._held:
                conn.close()
            self._thread.join(timeout=5)


def _client(tmp_path: Path, port: int) -> LocalAirflow:
    config = ServerConfig(home=tmp_path, dags_folder=tmp_path, plugins_folder=tmp_path, port=port)
    return LocalAirflow(config)


@pytest.fixture(autouse=True)
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(airflow_server, "_REQUEST_TIMEOUT_S", 0.5)


def test_an_unanswered_read_is_asked_again_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "component-logs").mkdir()
    with StallingServer(stall=2).running() as server:
        answer = _client(tmp_path, server.port)._request("GET", "/api/v2/x", auth=False)
    assert answer == {"state": "running"}
    assert server.requests == [b"GET /api/v2/x HTTP/1.1"] * 3
    stalls = capsys.readouterr().err.splitlines()
    assert len(stalls) == 2
    assert "GET /api/v2/x unanswered" in stalls[0] and "try 1 of 4" in stalls[0]
    assert "load " in stalls[0] and "MiB available" in stalls[0]
    assert (tmp_path / "component-logs" / "api-stalls.log").read_text().splitlines() == stalls


def test_a_read_unanswered_every_time_fails_after_its_tries(tmp_path: Path) -> None:
    with StallingServer(stall=10).running() as server, pytest.raises(OSError):
        _client(tmp_path, server.port)._request("GET", "/api/v2/x", auth=False)
    assert len(server.requests) == airflow_server._READ_TRIES


def test_an_unanswered_write_is_never_repeated(tmp_path: Path) -> None:
    with StallingServer(stall=1).running() as server, pytest.raises(OSError):
        _client(tmp_path, server.port)._request("POST", "/api/v2/x", {"a": 1}, auth=False)
    assert server.requests == [b"POST /api/v2/x HTTP/1.1"]


def test_a_refused_connection_is_not_a_stall(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
    with pytest.raises(OSError) as raised:
        _client(tmp_path, port)._request("GET", "/api/v2/x", auth=False)
    assert isinstance(getattr(raised.value, "reason", raised.value), ConnectionRefusedError)
    assert capsys.readouterr().err == ""  # raised at once: no stall reported, no try again


def test_the_harness_parses_dags_every_ten_minutes_and_waits_on_a_busy_api(tmp_path: Path) -> None:
    env = _client(tmp_path, 1).environment()
    assert env["AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL"] == "600"
    assert env["AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"] == "30"
