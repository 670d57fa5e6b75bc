"""A Debian 13 (trixie) root folder holding Slurm 24.11, for the private Slurm of
`devtools.servers.slurm_cluster` beside the host's 22.05: made once by ``debootstrap`` from
Debian's own packages and cached under the repository's ``.cache/``, keyed by the package list.

Slurm 24.11's programs need trixie's glibc, so each of them (daemons and clients) runs inside
the root: `enter_argv` wraps a command in a private mount namespace (``unshare -m``) where the
host's ``/dev``, ``/proc``, ``/sys``, ``/tmp`` and the folders holding this Python and the
repository are bind-mounted at the same paths, then ``chroot``. The mounts end with the process;
nothing is mounted on the host. Cost and facts: docs/slurm-versions.md.

``python -m devtools.servers.slurm_root`` builds the root (if missing) and prints its path.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

SUITE = "trixie"
MIRROR = "http://deb.debian.org/debian"
VERSION = "24.11"
# Slurm's packages as `make system-packages` names them, plus libffi8: the project's Python
# (bind-mounted from the host) needs it for ctypes, and minbase lacks it.
PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurm-client",
    "munge",
    "slurmrestd",
    "slurm-wlm-jwt-plugin",
    "libffi8",
)
HOST_TOOLS = ("debootstrap", "unshare", "chroot", "mount")
# Folders a bind mount must never cover in the root: they hold trixie's own system.
_SYSTEM_DIRS = frozenset({"bin", "boot", "etc", "lib", "lib64", "sbin", "usr", "var", "run"})
# Host files mounted over the root's: this machine's name must resolve as on the host (else
# a lookup of it waits on DNS: scancel timed out, JAX's gloo could not start), and its users
# be the host's (a job submitted as another account: sbatch --uid).
HOST_FILES = ("/etc/hosts", "/etc/passwd", "/etc/group")
_REPO = Path(__file__).resolve().parents[2]
# At the top of a finished root: it marks the root built, and tells a client wrapper that it
# already runs inside the root (a job's srun: ``unshare`` cannot be nested in the chroot).
MARKER = ".rcpflow-slurm-root"


class SlurmRootError(RuntimeError):
    """The root could not be built or entered; the message names the step."""


def _find(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def root_dir(cache: Path | None = None) -> Path:
    """Where the root of this package list lives (built or not)."""
    key = hashlib.sha256(" ".join((SUITE, MIRROR, *PACKAGES)).encode()).hexdigest()[:12]
    return (cache or _REPO / ".cache") / "slurm-root" / f"{SUITE}-{key}"


def missing_tools(cache: Path | None = None) -> list[str]:
    """The host programs needed to build (when not built yet) and enter the root."""
    needed = (
        HOST_TOOLS if not is_built(cache) else tuple(t for t in HOST_TOOLS if t != "debootstrap")
    )
    missing = [name for name in needed if _find(name) is None]
    if os.geteuid() != 0:
        missing.append("root (chroot and mount need it)")
    return missing


def is_built(cache: Path | None = None) -> bool:
    return (root_dir(cache) / MARKER).exists()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """One builder at a time (several test sessions may start at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def run_logged(
    argv: Sequence[str],
    log: Path,
    what: str,
    *,
    error: type[Exception],
    timeout_s: float = 600.0,
    stdin: IO[bytes] | None = None,
    env: Mapping[str, str] | None = None,
    tail_lines: int = 25,
) -> None:
    """Run `argv` with its output appended to `log` (after a ``$ argv`` line); `error` naming
    `what`, the log and its last `tail_lines` lines when it fails, times out or cannot start."""
    with log.open("a") as out:
        out.write(f"\n$ {shlex.join(argv)}\n")
        out.flush()
        try:
            proc = subprocess.run(
                list(argv),
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
                env=None if env is None else dict(env),
            )
        except subprocess.TimeoutExpired as exc:
            raise error(f"{what} took over {timeout_s:.0f} s; log {log}") from exc
        except OSError as exc:
            raise error(f"{what}: {exc}; log {log}") from exc
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-tail_lines:])
        raise error(f"{what} exited {proc.returncode}; log {log}:\n{tail}")


def ensure_root(cache: Path | None = None, log: Path | None = None) -> Path:
    """The root, built first if missing (``debootstrap --variant=minbase``; about a minute
    and 300 MB, docs/slurm-versions.md). A failed build leaves nothing that looks built."""
    root = root_dir(cache)
    if is_built(cache):
        return root
    with file_lock(root.with_name(root.name + ".lock")):
        if is_built(cache):
            return root
        debootstrap = _find("debootstrap")
        if debootstrap is None:
            raise SlurmRootError("debootstrap is not installed (make system-packages)")
        partial = root.with_name(root.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        log = log or root.with_name(root.name + ".log")
        started = time.monotonic()
        with log.open("w") as out:
            proc = subprocess.run(
                [
                    debootstrap,
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    SUITE,
                    str(partial),
                    MIRROR,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if proc.returncode != 0:
            tail = log.read_text(errors="replace")[-2000:]
            raise SlurmRootError(
                f"debootstrap {SUITE} exited {proc.returncode}; log {log}:\n{tail}"
            )
        # minbase writes no /etc/hosts: "localhost" must resolve without DNS in the root.
        (partial / "etc" / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
        for deb in (partial / "var" / "cache" / "apt" / "archives").glob("*.deb"):
            deb.unlink()  # the downloaded packages (~47 MB), installed already
        partial.rename(root)
        (root / MARKER).write_text(f"built in {time.monotonic() - started:.0f} s\n")
    return root


def bind_dirs(extra: Sequence[str] = ()) -> list[str]:
    """The host folders mounted into the root at the same paths: the kernel's, the temporary
    folder, and the top folder of this Python, of its venv and of the repository (a job runs
    the project's Python). A top folder that is part of the system (``/usr``: a Debian
    Python) is left out: the root's own must stay."""
    wanted = ["/dev", "/proc", "/sys", "/tmp"]
    for path in (sys.prefix, sys.base_prefix, str(_REPO), *extra):
        for candidate in (Path(path), Path(path).resolve()):
            parts = candidate.parts
            if len(parts) > 1 and parts[1] not in _SYSTEM_DIRS:
                wanted.append(f"/{parts[1]}")
    return list(dict.fromkeys(wanted))


def enter_argv(
    root: Path, argv: Sequence[str], *, user: str | None = None, binds: Sequence[str] = ()
) -> list[str]:
    """`argv` run inside `root` (as `user`, a name in the root's passwd, if given). The
    wrapper execs down to the program, so the PID of the process started is the program's."""
    mounts = " && ".join(
        [
            *(
                f"mkdir -p {shlex.quote(str(root) + d)} && mount --rbind {shlex.quote(d)} "
                f"{shlex.quote(str(root) + d)}"
                for d in bind_dirs(binds)
            ),
            *(
                f"mount --bind {shlex.quote(f)} {shlex.quote(str(root) + f)}"
                for f in HOST_FILES
                if Path(f).exists()
            ),
        ]
    )
    userspec = f"--userspec={shlex.quote(user)}:{shlex.quote(user)} " if user else ""
    script = f'{mounts} && exec chroot {userspec}{shlex.quote(str(root))} "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]


def program_path(root: Path, name: str) -> str | None:
    """The root's `name` (sbin included) as seen inside the root, or None."""
    for folder in ("usr/sbin", "usr/bin"):
        if (root / folder / name).exists():
            return f"/{folder}/{name}"
    return None


def client_wrapper(root: Path, program: str) -> str:
    """A shell script that runs the root's `program` with its arguments (put first on PATH).
    That PATH reaches the root too (a job's environment: its ``srun``), where the script runs
    the program itself; either way by its full path, never the wrapper again."""
    inside = shlex.quote(program_path(root, program) or f"/usr/bin/{program}")
    argv = " ".join(shlex.quote(a) for a in enter_argv(root, [inside]))
    return f'#!/bin/sh\nif [ -e /{MARKER} ]; then exec {inside} "$@"; fi\nexec {argv} "$@"\n'


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.servers.slurm_root",
        description=f"Build (once) the Debian {SUITE} root holding Slurm {VERSION}.",
    )
    parser.parse_args(argv)
    missing = missing_tools()
    if missing:
        print(f"slurm_root: missing: {', '.join(missing)} (make system-packages)", file=sys.stderr)
        return 2
    try:
        root = ensure_root()
    except SlurmRootError as error:
        print(f"slurm_root: {error}", file=sys.stderr)
        return 1
    print(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
