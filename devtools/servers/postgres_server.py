"""A private PostgreSQL on 127.0.0.1 for tests and demos: Airflow's metadata DB as a
deployment has it (Airflow documents SQLite as development-only).

Debian's server binaries (``/usr/lib/postgresql/<version>/bin``) build a throwaway cluster in a
fresh temporary folder (``initdb``, trust authentication on loopback only), start ``postgres``
directly so that the PID we hold is the postmaster's, create one database, and stop it by that
PID (SIGINT is PostgreSQL's fast shutdown; SIGKILL after a grace period), then delete the folder.
PostgreSQL refuses to run as root: under root the cluster belongs to, and the server runs as,
the unprivileged ``nobody``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from rcpflow.files.captured import run_captured
from tasks.jobs.processes import Server, free_port, stop_processes

SEARCH = "/usr/lib/postgresql"
UNPRIVILEGED_USER = "nobody"
SUPERUSER = "postgres"


class PostgresError(RuntimeError):
    """The local PostgreSQL could not be set up or started; the message says which step."""


def server_bindir() -> Path | None:
    """The newest installed PostgreSQL server's bin folder (with initdb and postgres)."""
    found = []
    for candidate in Path(SEARCH).glob("*/bin"):
        if (candidate / "initdb").is_file() and (candidate / "postgres").is_file():
            with contextlib.suppress(ValueError):
                found.append((float(candidate.parent.name), candidate))
    return max(found)[1] if found else None


class LocalPostgres(Server):
    """Context manager: ``with LocalPostgres("airflow") as pg: pg.sqlalchemy_url()``."""

    def __init__(self, database: str, bindir: Path | None = None) -> None:
        found = bindir or server_bindir()
        if found is None:
            raise PostgresError(f"no PostgreSQL server under {SEARCH}/*/bin (initdb, postgres)")
        self.bindir = found
        self.database = database
        self.port = free_port()
        self.root: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        # Under root, run as nobody (initdb and postgres refuse root).
        self._account = pwd.getpwnam(UNPRIVILEGED_USER) if os.geteuid() == 0 else None
        self._uid = None if self._account is None else self._account.pw_uid
        self._gid = None if self._account is None else self._account.pw_gid
        self._extra_groups: list[int] | None = None if self._account is None else []

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def sqlalchemy_url(self, driver: str = "psycopg2") -> str:
        return f"postgresql+{driver}://{SUPERUSER}@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *argv: str, timeout_s: float = 120.0) -> None:
        proc = run_captured(
            argv,
            timeout_s=timeout_s,
            user=self._uid,
            group=self._gid,
            extra_groups=self._extra_groups,
        )
        if proc.returncode != 0:
            tail = proc.stdout.decode(errors="replace")[-3000:]
            raise PostgresError(f"{Path(argv[0]).name} exited with {proc.returncode}:\n{tail}")

    def start(self, timeout_s: float = 60.0) -> None:
        # A fresh folder in the system temp dir (world-traversable, unlike pytest's own).
        self.root = Path(tempfile.mkdtemp(prefix="rcpflow-postgres-"))
        if self._account is not None:
            os.chown(self.root, self._account.pw_uid, self._account.pw_gid)
        data, log = self.root / "data", self.root / "server.log"
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
        )
        with open(log, "ab") as out:
            if self._account is not None:
                os.chown(log, self._account.pw_uid, self._account.pw_gid)
            self.process = subprocess.Popen(
                [
                    str(self.bindir / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.root),  # its Unix socket, not /var/run/postgresql
                    "-c",
                    "listen_addresses=127.0.0.1",
                    # a throwaway cluster: durability buys nothing, speed does
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=self._uid,
                group=self._gid,
                extra_groups=self._extra_groups,
            )
        self._wait_ready(timeout_s, log)
        self._run(
            str(self.bindir / "createdb"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            SUPERUSER,
            self.database,
        )

    def _wait_ready(self, timeout_s: float, log: Path) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                raise PostgresError(f"postgres exited with {self.process.returncode}:\n{tail}")
            ready = subprocess.run(
                [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
                timeout=30,
                check=False,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.2)
        raise PostgresError(f"postgres on 127.0.0.1:{self.port} not ready after {timeout_s}s")

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGINT the postmaster (fast shutdown: backends end, nothing waits for clients), then
        SIGKILL its group after `grace_s`; delete the cluster's folder."""
        if self.process is not None:
            stop_processes([self.process], first=signal.SIGINT, grace_s=grace_s, group=True)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
