"""A private OpenSSH server on 127.0.0.1 for tests and the demo: Debian's ``sshd`` on a free
port with a host key and one user key made for it (key login only, for the current user),
stopped by the PID we hold. It stands in for a Slurm cluster's login node: `set_env` is put
into every session (``SetEnv``), e.g. the private Slurm's ``SLURM_CONF``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from tasks.jobs.processes import Server, free_port, stop_processes

_START_TIMEOUT_S = 20.0
_PRIVSEP_DIR = Path("/run/sshd")  # Debian's sshd needs it when started as root


class SshdError(RuntimeError):
    """The private sshd could not be started; the message names the step and its log."""


def _find(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def missing_binaries() -> list[str]:
    return [name for name in ("sshd", "ssh-keygen") if _find(name) is None]


class LocalSshd(Server):
    """Context manager: ``with LocalSshd(set_env={...}) as s: s.port, s.user_key``."""

    def __init__(self, set_env: Mapping[str, str] | None = None) -> None:
        self.set_env = dict(set_env or {})
        self.root = Path()
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def user(self) -> str:
        import getpass

        return getpass.getuser()

    @property
    def user_key(self) -> Path:
        """The private key that logs in as `user`."""
        return self.root / "user_ed25519"

    @property
    def host_public_key(self) -> str:
        """The server's public host key, ``ssh-ed25519 AAAA...`` (what a client pins)."""
        return (self.root / "host_ed25519.pub").read_text().strip()

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"

    def start(self) -> None:
        missing = missing_binaries()
        if missing:
            raise SshdError(f"not installed: {', '.join(missing)} (Debian's openssh-server)")
        self.root = Path(tempfile.mkdtemp(prefix="rcpflow-sshd-"))
        self.root.chmod(0o700)
        keygen = _find("ssh-keygen")
        assert keygen is not None
        for name in ("host_ed25519", "user_ed25519"):
            subprocess.run(
                [keygen, "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(self.root / name)],
                check=True,
                capture_output=True,
            )
        shutil.copy(self.root / "user_ed25519.pub", self.root / "authorized_keys")
        if os.geteuid() == 0 and not _PRIVSEP_DIR.exists():
            _PRIVSEP_DIR.mkdir(mode=0o755)
        self.port = free_port()
        config = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.root}/host_ed25519",
            f"PidFile {self.root}/sshd.pid",
            f"AuthorizedKeysFile {self.root}/authorized_keys",
            f"AllowUsers {self.user}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",
            "PrintMotd no",
        ]
        if self.set_env:
            config.append("SetEnv " + " ".join(f"{k}={v}" for k, v in self.set_env.items()))
        (self.root / "sshd_config").write_text("\n".join(config) + "\n")
        sshd = _find("sshd")
        assert sshd is not None
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sshd, "-D", "-e", "-f", str(self.root / "sshd_config")],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._listening():
            if self.process.poll() is not None:
                raise SshdError(
                    f"sshd exited with {self.process.returncode}: {self.log.read_text()[-2000:]}"
                )
            if time.monotonic() > deadline:
                raise SshdError(f"sshd: not listening after {_START_TIMEOUT_S:.0f} s")
            time.sleep(0.1)

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                return conn.recv(4).startswith(b"SSH-")
        except OSError:
            return False

    def stop(self) -> None:
        # sshd forks a process per session; its children end with their sessions.
        if self.process is not None:
            stop_processes([self.process], first=signal.SIGTERM, grace_s=5.0, with_descendants=True)
            self.process = None

    def cleanup(self) -> None:
        self.stop()
        if self.root != Path() and self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)
