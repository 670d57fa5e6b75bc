"""The control plane's processes: each component started in its own session with its output in a
log file, stopped by its PID; the working folder of a server that starts them; and the one wait
every start uses (its error ends with the component's log tail)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from devtools.k8s.errors import ControlPlaneError
from tasks.jobs.processes import stop_processes

STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 25

T = TypeVar("T")


class Component:
    """One process of the control plane: started in its own session with its output in
    ``<logs>/<name>.log``, stopped by its PID."""

    def __init__(
        self, name: str, argv: Sequence[str], log_dir: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log_dir / f"{name}.log"
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            log.write(f"--- start: {' '.join(self.argv)}\n".encode())
            log.flush()
            try:
                self.process = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **self.env},
                    start_new_session=True,
                )
            except OSError as exc:
                raise ControlPlaneError(f"{self.name}: cannot start {self.argv[0]}: {exc}") from exc

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        if self.process is not None:
            stop_processes([self.process], first=signal.SIGTERM, grace_s=grace_s, group=True)

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str) -> ControlPlaneError:
        state = "running"
        if self.process is None:
            state = "not started"
        elif self.process.poll() is not None:
            state = f"exited with {self.process.returncode}"
        return ControlPlaneError(
            f"{self.name} ({state}): {what}; last lines of {self.log}:\n{self.tail()}"
        )


class WorkFolder:
    """The working folder of a server started here (a mixin): `workdir` when given, else a
    fresh one that the server owns and removes at its stop; its components' logs in `logs`."""

    workdir: Path | None
    _owns_workdir: bool

    def not_started(self) -> Exception:
        """What `root` raises before the start made the folder."""
        return ControlPlaneError(f"{type(self).__name__} is not started")

    @property
    def root(self) -> Path:
        if self.workdir is None:
            raise self.not_started()
        return self.workdir

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def make_workdir(self, prefix: str, parent: str | None = None) -> None:
        """`workdir`, a fresh folder under `parent` (the system's temporary folder by default)
        when none was given, with its `logs`."""
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            self._owns_workdir = True
        self.logs.mkdir(parents=True, exist_ok=True)

    def remove_workdir(self) -> None:
        """The folder removed, if `make_workdir` made it."""
        if self._owns_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def wait_until(
    check: Callable[[], T | None],
    *,
    timeout_s: float,
    what: str,
    component: Component | None = None,
    interval_s: float = 0.2,
) -> T:
    """Poll `check` until it returns something not None; on timeout (or when `component` dies)
    ControlPlaneError naming `what`, the component and its log tail. Exceptions of `check`
    count as not yet (the last one is in the error)."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while True:
        try:
            result = check()
        except Exception as exc:  # any failure of a probe is "not yet"
            last = exc
            result = None
        if result is not None:
            return result
        if component is not None and component.process is not None and not component.running():
            raise component.failure(f"exited while waiting for {what} (last probe: {last})")
        if time.monotonic() >= deadline:
            message = f"{what}: not within {timeout_s:.0f}s (last probe: {last})"
            if component is not None:
                raise component.failure(message)
            raise ControlPlaneError(message)
        time.sleep(interval_s)
