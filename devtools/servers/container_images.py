"""The project's container images built and run on this machine with no registry: a private
``dockerd`` (its own socket, data root and exec root; no bridge, no iptables), a base image made
from Debian by ``debootstrap`` and tagged with the name the Dockerfiles' ``FROM`` uses, and the
images of ``docker/`` built from a clean build context with ``--network host``.

- **Base image** (`base_rootfs`): Debian 12 minbase with ``ca-certificates`` and ``python3``
  (for the libraries CPython links), and this machine's CPython 3.11 (the interpreter of the
  project's venv: Debian 12's own 3.11.2 is older than some pinned packages allow) copied to
  ``/usr/local`` as in the official ``python:3.11-slim``, with pip from ``ensurepip``. This
  machine's extra CA certificates and a ``/etc/pip.conf`` naming the system bundle are in it so
  that pip reaches the package index from a build as it does here: a local test image, never
  pushed. Made once (about a minute) and kept as a tar under the cache, keyed by its inputs.
- **Build context** (`build_context`): what a BuildKit build of ``docker build -f
  docker/Dockerfile.X .`` sends: the paths the Dockerfile COPYs, less what
  ``docker/Dockerfile.X.dockerignore`` excludes (Docker 20.10's built-in frontend does not read
  a Dockerfile's own ignore file, so the context is assembled here with it as ``.dockerignore``).
  Its content hash (with the base image's key) is the image tag: an unchanged context is not
  built again (`Docker.ensure_image`).
- **Daemon** (`Docker`): ``dockerd`` on a private socket with its data root under the cache
  (images survive between runs) and everything else under a fresh folder; one daemon per data
  root at a time (a file lock, held while it runs). Stopped by its PID (containers removed
  first); left-over mounts under its folders are unmounted and the host paths it creates
  (``/run/docker``, ``/etc/docker/key.json``) removed when it created them.

Needs root and Debian's ``docker.io``, ``containerd``, ``runc`` and ``debootstrap`` (``make
system-packages``); `missing_tools` names what is absent. Measured times: docs/containers.md.

    python -m devtools.servers.container_images [tpu|airflow ...]

builds the images (when their context changed) and prints their tags.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from devtools.k8s.processes import Component, WorkFolder, wait_until
from devtools.servers.slurm_root import file_lock, run_logged
from tasks.jobs.processes import Server

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "docker"
CACHE = Path(os.environ.get("RCPFLOW_CONTAINER_CACHE", str(REPO / ".cache" / "containers")))
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# minbase plus what the copied CPython links against (python3 pulls every library its stdlib
# modules need: libssl3, libffi8, libsqlite3, libbz2, liblzma, zlib, libreadline, ...).
BASE_PACKAGES = ("ca-certificates", "python3")
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
# Debian's client: it has BuildKit (the first `docker` on PATH here may be another without it).
DOCKER_CLIENT = "/usr/bin/docker"
DOCKERD = "dockerd"
PYTHON_VERSION = "3.11"
# The images of docker/ this harness builds: name -> Dockerfile.
DOCKERFILES = {"tpu": "Dockerfile.tpu", "airflow": "Dockerfile.airflow"}
REPOSITORIES = {"tpu": "rcpflow-tpu", "airflow": "rcpflow-airflow"}
# The pods' sandbox (pause) image, made from the base image: PID 1 of each pod's sandbox
# waits for a signal and reaps what ends (SIGCHLD ignored: the kernel reaps).
PAUSE_REPOSITORY = "rcpflow-pause"
PAUSE_BASE = "python:3.11-slim"
PAUSE = (
    "import os, signal\n"
    "for s in (signal.SIGTERM, signal.SIGINT): signal.signal(s, lambda *a: os._exit(0))\n"
    "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
    "while True: signal.pause()\n"
)
START_TIMEOUT_S = 60.0
BUILD_TIMEOUT_S = 1800.0
BASE_ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
)
# Stdlib parts the slim image leaves out too (and the host venv's packages: never copied).
_PY_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "site-packages", "__pycache__"}


class ContainerError(RuntimeError):
    """A step of building or running an image failed; the message names it (and a log)."""


def _find(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def missing_tools() -> list[str]:
    """What this machine lacks to build and run the images (empty: nothing)."""
    missing = [n for n in ("dockerd", "containerd", "runc", "debootstrap") if _find(n) is None]
    if not Path(DOCKER_CLIENT).is_file():
        missing.append(f"{DOCKER_CLIENT} (Debian's docker.io)")
    if os.geteuid() != 0:
        missing.append("root")
    return missing


def _run_logged(
    argv: Sequence[str],
    log: Path,
    what: str,
    *,
    timeout_s: float = 600.0,
    stdin: IO[bytes] | None = None,
    env: Mapping[str, str] | None = None,
) -> None:
    run_logged(argv, log, what, error=ContainerError, timeout_s=timeout_s, stdin=stdin, env=env)


# -- the base image


def _host_python() -> Path:
    """The prefix of this machine's CPython 3.11 (the project's interpreter)."""
    if sys.version_info[:2] != (3, 11):
        raise ContainerError(
            f"the base image carries this machine's CPython {PYTHON_VERSION}; this is "
            f"{sys.version.split()[0]}"
        )
    return Path(sys.base_prefix)


def _hash_files(digest: hashlib._Hash, paths: Sequence[Path], root: Path) -> None:
    for path in sorted(paths):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(b"x" if os.access(path, os.X_OK) else b"-")
        digest.update(hashlib.sha256(path.read_bytes()).digest())


def base_key() -> str:
    """What the base image is made of: the suite, packages, CPython and CA certificates."""
    digest = hashlib.sha256()
    digest.update(json.dumps([SUITE, MIRROR, BASE_PACKAGES, sys.version, 2]).encode())
    if HOST_CA_DIR.is_dir():
        _hash_files(digest, list(HOST_CA_DIR.glob("*.crt")), HOST_CA_DIR)
    return digest.hexdigest()[:16]


def _copy_python(prefix: Path, root: Path) -> None:
    """CPython from `prefix` into the root's /usr/local (binary, shared library, stdlib)."""
    local = root / "usr" / "local"
    version = f"python{PYTHON_VERSION}"
    (local / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(prefix / "bin" / version, local / "bin" / version)
    for lib in (prefix / "lib").glob(f"libpython{PYTHON_VERSION}*.so*"):
        shutil.copy2(lib, local / "lib" / lib.name, follow_symlinks=False)

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in _PY_SKIP or n.startswith("config-")}
        return skip if Path(folder) == prefix / "lib" / version else {"__pycache__"} & set(names)

    shutil.copytree(
        prefix / "lib" / version, local / "lib" / version, ignore=ignore, dirs_exist_ok=True
    )
    (local / "lib" / version / "site-packages").mkdir(exist_ok=True)
    for name in ("python3", "python"):
        (local / "bin" / name).symlink_to(version)


def base_rootfs(cache: Path = CACHE) -> Path:
    """The base image's root filesystem as a tar (built first if missing; see the module doc).
    A failed build leaves nothing that looks built; one builder at a time."""
    tar = cache / f"base-{SUITE}-py{PYTHON_VERSION}-{base_key()}.tar"
    if tar.is_file():
        return tar
    with file_lock(cache / "base.lock"):
        if tar.is_file():
            return tar
        debootstrap = _find("debootstrap")
        if debootstrap is None:
            raise ContainerError("debootstrap is not installed (make system-packages)")
        prefix = _host_python()
        log = tar.with_suffix(".log")
        log.write_text(f"building {tar}\n")
        work = Path(tempfile.mkdtemp(prefix="rcpflow-base-", dir=cache))
        root = work / "root"
        try:
            _run_logged(
                [
                    debootstrap,
                    "--variant=minbase",
                    f"--include={','.join(BASE_PACKAGES)}",
                    SUITE,
                    str(root),
                    MIRROR,
                ],
                log,
                f"debootstrap {SUITE}",
                timeout_s=900,
            )
            (root / "etc" / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
            if HOST_CA_DIR.is_dir():
                target = root / HOST_CA_DIR.relative_to("/")
                target.mkdir(parents=True, exist_ok=True)
                for crt in HOST_CA_DIR.glob("*.crt"):
                    shutil.copyfile(crt, target / crt.name)
            (root / "etc" / "pip.conf").write_text(
                "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n"
            )
            _copy_python(prefix, root)
            python = f"/usr/local/bin/python{PYTHON_VERSION}"
            for what, argv in (
                ("update-ca-certificates", ["update-ca-certificates"]),
                ("ldconfig", ["ldconfig"]),
                ("ensurepip", [python, "-m", "ensurepip", "--default-pip"]),
                ("the interpreter check", [python, "-c", "import ssl, ctypes, sqlite3, lzma"]),
            ):
                _run_logged(
                    ["chroot", str(root), *argv],
                    log,
                    what,
                    env={"PATH": BASE_ENV[0].split("=", 1)[1], "LANG": "C.UTF-8"},
                )
            if not (root / "usr" / "local" / "bin" / "pip").exists():
                (root / "usr" / "local" / "bin" / "pip").symlink_to("pip3")
            for folder in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for item in (root / folder).glob("*"):
                    if item.is_file():
                        item.unlink()
            partial = tar.with_name(tar.name + ".partial")
            with tarfile.open(partial, "w") as out:
                out.add(root, arcname=".")
            partial.rename(tar)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for old in cache.glob(f"base-{SUITE}-*.tar"):
            if old != tar:
                old.unlink()
    return tar


# -- build contexts


def dockerfile_instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    lines = [ln for ln in dockerfile.read_text().splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            op, _, rest = line.strip().partition(" ")
            found.append((op.upper(), rest.strip()))
    return found


def base_image_of(dockerfile: Path) -> str:
    [base] = [args for op, args in dockerfile_instructions(dockerfile) if op == "FROM"]
    return base.split()[0]


def ignore_patterns(dockerfile: Path) -> list[str]:
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    patterns = []
    for line in ignore.read_text().splitlines() if ignore.is_file() else []:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            raise ContainerError(f"{ignore}: exceptions ({line}) are not supported here")
        patterns.append(line.strip("/"))
    return patterns


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    # Docker's .dockerignore: Go's filepath.Match per path element, plus "**" for any depth.
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


def is_ignored(rel: str, patterns: Sequence[str]) -> bool:
    """Whether `rel` (a path relative to the context) or a folder above it is excluded."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(_pattern_regex(p).fullmatch(pre) for p in patterns for pre in prefixes)


def build_context(name: str, target: Path) -> str:
    """Assemble the build context of image `name` in `target` (empty or missing): the paths its
    Dockerfile COPYs less the ignored ones, the Dockerfile and its ignore file as
    ``.dockerignore``. Returns its content hash (with the base image's key)."""
    dockerfile = DOCKER_DIR / DOCKERFILES[name]
    patterns = ignore_patterns(dockerfile)
    files: list[Path] = []
    for op, args in dockerfile_instructions(dockerfile):
        if op not in ("COPY", "ADD"):
            continue
        *sources, _dest = [a for a in shlex.split(args) if not a.startswith("--")]
        for source in sources:
            path = REPO / source.rstrip("/")
            if not path.exists():
                raise ContainerError(f"{dockerfile.name}: COPY {source}: no such path")
            candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*"))
            for item in candidates:
                rel = item.relative_to(REPO).as_posix()
                if item.is_file() and not item.is_symlink() and not is_ignored(rel, patterns):
                    files.append(item)
    target.mkdir(parents=True, exist_ok=True)
    for item in sorted(set(files)):
        dest = target / item.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(item, dest)
    shutil.copyfile(dockerfile, target / "Dockerfile")
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    if ignore.is_file():
        shutil.copyfile(ignore, target / ".dockerignore")
    digest = hashlib.sha256(base_key().encode())
    _hash_files(digest, [p for p in target.rglob("*") if p.is_file()], target)
    return digest.hexdigest()[:16]


# -- the daemon


def mounts_under(folders: Sequence[Path]) -> list[str]:
    """The mount points in or under `folders`, deepest first (the order to unmount them)."""
    found = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            point = line.split()[4].replace("\\040", " ")
            if any(point == str(f) or point.startswith(f"{f}/") for f in folders):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def remove_empty_dirs(top: Path) -> None:
    """`top` and the folders under it, those that are empty (what another daemon still uses
    stays)."""
    if not top.is_dir():
        return
    for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            folder.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


@dataclass
class Docker(WorkFolder, Server):
    """``with Docker() as docker:`` a private dockerd (see the module doc): `client` runs
    Debian's docker client against it."""

    cache: Path = CACHE
    workdir: Path | None = None
    timeout_s: float = START_TIMEOUT_S
    component: Component | None = None
    _owns_workdir: bool = False
    _lock: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _created: list[Path] = field(default_factory=list)

    @property
    def data_root(self) -> Path:
        return self.cache / "docker-root"

    def not_started(self) -> Exception:
        return ContainerError("dockerd is not started")

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    def start(self) -> None:
        missing = missing_tools()
        if missing:
            raise ContainerError(f"cannot run dockerd: missing {', '.join(missing)}")
        # short: dockerd's containerd puts sockets under it (108-byte socket paths)
        self.make_workdir("rcpd-", "/tmp")
        self._lock.enter_context(file_lock(self.cache / "docker-root.lock"))
        # /run/containerd/s holds the shims' sockets of dockerd's containerd
        for path in (Path("/run/docker"), Path("/etc/docker/key.json"), Path("/run/containerd")):
            if not path.exists():
                self._created.append(path)
        config = self.root / "daemon.json"
        config.write_text("{}\n")
        self.component = Component(
            "dockerd",
            [
                _find(DOCKERD) or DOCKERD,
                f"--config-file={config}",
                f"--data-root={self.data_root}",
                f"--exec-root={self.root / 'exec'}",
                f"--host=unix://{self.socket}",
                f"--pidfile={self.root / 'docker.pid'}",
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
                "--ip-forward=false",
                "--ip-masq=false",
                "--userland-proxy=false",
                "--storage-driver=overlay2",
                "--log-level=warn",
            ],
            self.logs,
        )
        self.component.start()
        wait_until(
            lambda: True if self.client("version", check=False).returncode == 0 else None,
            timeout_s=self.timeout_s,
            what="dockerd answering",
            component=self.component,
        )

    def stop(self) -> None:
        try:
            if self.component is not None and self.component.running():
                ids = self.client("ps", "-aq", check=False).stdout.split()
                if ids:
                    self.client("rm", "-f", *ids, check=False)
            if self.component is not None:
                self.component.stop(grace_s=20)
            if self.workdir is not None:
                for point in mounts_under([self.workdir, self.data_root]):
                    subprocess.run(["umount", "-l", point], check=False, capture_output=True)
            for path in self._created:
                if path == Path("/run/containerd"):
                    remove_empty_dirs(path)  # a kubelet's containerd may use it too
                elif path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        path.unlink()
            self._created.clear()
        finally:
            self._lock.close()
            self.remove_workdir()

    def command(self, *args: str) -> list[str]:
        """The argument list of ``docker ARGS`` against this daemon, for a process of its own
        (a container run in the foreground); its environment adds `client_env`."""
        return [DOCKER_CLIENT, f"--host=unix://{self.socket}", *args]

    def client_env(self) -> dict[str, str]:
        """What the docker client needs in its environment besides the caller's."""
        return {"DOCKER_BUILDKIT": "1", "DOCKER_CONFIG": str(self.root / "cli")}

    def client(
        self,
        *args: str,
        check: bool = True,
        timeout_s: float = 600.0,
        stdin: IO[bytes] | None = None,
        stdout: IO[bytes] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``docker ARGS`` against this daemon; check: ContainerError with its output."""
        try:
            proc = subprocess.run(
                self.command(*args),
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=stdout if stdout is not None else subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=stdout is None,
                env={**os.environ, **self.client_env()},
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ContainerError(
                f"docker {shlex.join(args)}: no answer in {timeout_s:.0f}s"
            ) from None
        if check and proc.returncode != 0:
            err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode()
            raise ContainerError(f"docker {shlex.join(args)} exited {proc.returncode}: {err}")
        return proc

    def has_image(self, tag: str) -> bool:
        return self.client("image", "inspect", tag, check=False).returncode == 0

    def ensure_base(self, tag: str) -> None:
        """The base image under `tag` (the Dockerfiles' FROM), imported when missing."""
        label = f"rcpflow.base={base_key()}"
        inspect = self.client("image", "inspect", "-f", "{{json .Config.Labels}}", tag, check=False)
        if inspect.returncode == 0 and f'"rcpflow.base":"{base_key()}"' in inspect.stdout:
            return
        tar = base_rootfs(self.cache)
        changes = [*(f"ENV {e}" for e in BASE_ENV), f"LABEL {label}", 'CMD ["python3"]']
        with tar.open("rb") as data:
            self.client("import", *(f"--change={c}" for c in changes), "-", tag, stdin=data)

    def ensure_image(self, name: str, log: Path | None = None) -> str:
        """The tag of image `name` (``tpu``, ``airflow``) built from the current context: built
        now unless an image of the same context hash exists. Older tags of it are removed."""
        repository = REPOSITORIES[name]
        with tempfile.TemporaryDirectory(prefix=f"rcpflow-ctx-{name}-") as ctx:
            context = Path(ctx)
            tag = f"{repository}:{build_context(name, context)}"
            if self.has_image(tag):
                return tag
            self.ensure_base(base_image_of(context / "Dockerfile"))
            log = log or self.cache / f"build-{name}.log"
            log.write_text(f"building {tag}\n")
            started = time.monotonic()
            _run_logged(
                self.command(
                    "build", "--network=host", "--progress=plain", f"--tag={tag}", str(context)
                ),
                log,
                f"docker build of {DOCKERFILES[name]}",
                timeout_s=BUILD_TIMEOUT_S,
                env={**os.environ, **self.client_env()},
            )
            with log.open("a") as out:
                out.write(f"built {tag} in {time.monotonic() - started:.1f} s\n")
        for line in self.client("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split():
            if line.startswith(f"{repository}:") and line != tag:
                self.client("rmi", line, check=False)
        self.client("image", "prune", "-f", check=False)
        return tag

    def ensure_pause(self) -> str:
        """The pods' pause image (`PAUSE`: a PID 1 that waits and reaps), built when missing."""
        tag = pause_tag()
        if not self.has_image(tag):
            self.ensure_base(PAUSE_BASE)
            dockerfile = f"FROM {PAUSE_BASE}\nCMD {json.dumps(['python3', '-c', PAUSE])}\n"
            with tempfile.TemporaryDirectory(prefix="rcpflow-ctx-pause-") as ctx:
                (Path(ctx) / "Dockerfile").write_text(dockerfile)
                self.client("build", "--network=none", f"--tag={tag}", ctx)
        return tag

    def save(self, tags: Sequence[str], target: Path) -> Path:
        """``docker save`` of `tags` into `target` (kept: a second call finds it)."""
        if target.is_file():
            return target
        partial = target.with_name(target.name + ".partial")
        with partial.open("wb") as out:
            self.client("save", *tags, stdout=out, timeout_s=900)
        partial.rename(target)
        return target


def pause_tag() -> str:
    return f"{PAUSE_REPOSITORY}:{hashlib.sha256((base_key() + PAUSE).encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class NodeImages:
    """What a kubelet's containerd loads: the job image and the pods' pause image (their tags)
    in one ``docker save`` archive."""

    job: str
    pause: str
    archive: Path


def node_images(cache: Path = CACHE) -> NodeImages:
    """The job image at the current context and the pause image, saved into one archive for
    containerd (``ctr image import``): built and saved first when missing. The archive of the
    current hashes is kept under the cache (older ones deleted)."""
    with tempfile.TemporaryDirectory(prefix="rcpflow-ctx-tpu-") as ctx:
        job = f"{REPOSITORIES['tpu']}:{build_context('tpu', Path(ctx))}"
    pause = pause_tag()
    archive = cache / "archives" / f"node-{job.split(':')[1]}-{pause.split(':')[1]}.tar"
    if not archive.is_file():
        archive.parent.mkdir(parents=True, exist_ok=True)
        with Docker(cache=cache) as docker:
            built = docker.ensure_image("tpu")
            if built != job:
                raise ContainerError(f"the job image's context changed while building ({built})")
            docker.ensure_pause()
            docker.save([job, pause], archive)
        for old in archive.parent.glob("node-*.tar"):
            if old != archive:
                old.unlink()
    return NodeImages(job=job, pause=pause, archive=archive)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"of {', '.join(DOCKERFILES)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in DOCKERFILES]
    if unknown:
        parser.error(f"unknown image {unknown[0]!r}: one of {', '.join(DOCKERFILES)}")
    try:
        with Docker() as docker:
            for name in args.names or DOCKERFILES:
                started = time.monotonic()
                tag = docker.ensure_image(name)
                print(f"{name}: {tag} ({time.monotonic() - started:.0f} s)")
    except (ContainerError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
