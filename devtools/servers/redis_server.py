"""A private Redis on 127.0.0.1: the Celery broker of the distributed Airflow
(`devtools.servers.distributed_airflow`), as Cloud Composer and the Helm chart run one.

Debian's ``redis-server`` runs in the foreground (so the PID we hold is the server's), on a port
from `free_port`, bound to loopback, without persistence (a broker's queue is rebuilt by the
schedulers: they resend what they did not see run), its files in a fresh temporary folder. It is
stopped by that PID (SIGTERM, SIGKILL after a grace period); `restart` starts it again on the
same port, which is what a broker outage looks like to Airflow.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tasks.jobs.processes import Server, free_port, stop_processes

BINARY = "redis-server"
HOST = "127.0.0.1"


class RedisError(RuntimeError):
    """The local Redis could not be started; the message says why."""


def missing_binary() -> str | None:
    """``redis-server`` when it is not installed (make system-packages installs it)."""
    return None if shutil.which(BINARY) else BINARY


class LocalRedis(Server):
    """Context manager: ``with LocalRedis() as r: r.url``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.root: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def log(self) -> Path:
        assert self.root is not None
        return self.root / "server.log"

    def start(self, timeout_s: float = 30.0) -> None:
        binary = shutil.which(BINARY)
        if binary is None:
            raise RedisError(f"not installed: {BINARY} (make system-packages installs it)")
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="rcpflow-redis-"))
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [
                    binary, "--bind", HOST, "--port", str(self.port), "--dir", str(self.root),
                    "--save", "", "--appendonly", "no", "--daemonize", "no",
                    "--protected-mode", "yes",
                ],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RedisError(f"redis-server exited with {self.process.returncode}:\n{tail}")
            if self.answers():
                return
            time.sleep(0.1)
        raise RedisError(f"redis-server on {HOST}:{self.port} not answering after {timeout_s}s")

    def answers(self) -> bool:
        """Whether the server answers PING (the protocol's own health check)."""
        try:
            with socket.create_connection((HOST, self.port), timeout=2) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop_server(self, grace_s: float = 10.0) -> None:
        """Stop the server by its PID, keeping its folder (and port) for `restart`."""
        if self.process is not None:
            stop_processes([self.process], first=signal.SIGTERM, grace_s=grace_s, group=True)

    def restart(self) -> None:
        """Stop and start again on the same port: a broker outage, as Airflow sees one."""
        self.stop_server()
        self.start()

    def stop(self, grace_s: float = 10.0) -> None:
        self.stop_server(grace_s)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
