"""MaxText's job environment on this machine: a Python 3.13 venv inside a Debian 13 (trixie)
root, made once and cached under the repository's ``.cache/``, keyed by its package lists.

MaxText 0.2.5 needs Python >= 3.12 and jax >= 0.11.1; the project's own venv is Python 3.11
with jax 0.10.2. In production the MaxText job runs in its own image (docker/Dockerfile.maxtext);
here the same package set (docker/constraints.maxtext.txt, installed with ``--no-deps``) goes
into a venv at `VENV` inside a minbase trixie root beside the one
`devtools.servers.slurm_root` makes for Slurm 24.11, entered with that module's helpers
(`slurm_root.enter_argv`: a private mount namespace, the host's ``/dev``, ``/proc``, ``/sys``,
``/tmp`` and the repository's folders bound at the same paths, then ``chroot``). The repository
is importable there (``PYTHONPATH``), so ``python -m tpu_jobs.maxtext.train`` and rcpflow's
recording library run without Airflow. Cost and facts: docs/maxtext.md.

``python -m devtools.servers.maxtext_env`` builds the environment (if missing), writes its Python
wrapper (`wrapper_path`, ``.cache/maxtext-env/python``: a script that runs the venv's Python in
the root, in the caller's folder) and prints the wrapper's path.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shlex
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from devtools.servers import slurm_root
from devtools.servers.slurm_root import MIRROR, SUITE

# Debian's Python 3.13 (and what pip needs to trust the host's certificate authorities).
DEBIAN_PACKAGES = ("python3.13", "python3.13-venv", "ca-certificates")
CONSTRAINTS = Path(__file__).resolve().parents[2] / "docker" / "constraints.maxtext.txt"
VENV = "/opt/maxtext"  # inside the root
PYTHON = f"{VENV}/bin/python"
MARKER = ".rcpflow-maxtext-env"
INSTALL_TIMEOUT_S = 1800.0
# The host's extra certificate authorities (an egress proxy's), trusted by pip in the root too.
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
# Host configuration pip reads, copied in for the install only (a cached root keeps none).
HOST_INSTALL_FILES = ("/etc/resolv.conf", "/etc/pip.conf")
_REPO = Path(__file__).resolve().parents[2]


class MaxTextEnvError(RuntimeError):
    """The environment could not be built or entered; the message names the step and its log."""


def pins() -> list[str]:
    """The pinned packages (``name==version`` lines of `CONSTRAINTS`, comments left out)."""
    lines = (line.split("#", 1)[0].strip() for line in CONSTRAINTS.read_text().splitlines())
    return sorted(line for line in lines if line)


def cache_key() -> str:
    """What the environment is made of: the suite, the mirror, the Debian packages and the
    pinned Python packages (a comment of the constraints file changes nothing)."""
    text = " ".join((SUITE, MIRROR, *DEBIAN_PACKAGES, VENV, *pins()))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def root_dir(cache: Path | None = None) -> Path:
    """Where the root of the current package lists lives (built or not)."""
    return (cache or _REPO / ".cache") / "maxtext-env" / f"{SUITE}-{cache_key()}"


def wrapper_path(cache: Path | None = None) -> Path:
    """Where `write_wrapper` puts the Python wrapper of the current environment: one path
    whatever the key (docker/deployment.maxtext.toml names it as its ``python``)."""
    return (cache or _REPO / ".cache") / "maxtext-env" / "python"


def is_built(cache: Path | None = None) -> bool:
    return (root_dir(cache) / MARKER).exists()


def missing_tools(cache: Path | None = None) -> list[str]:
    """Why the environment cannot be built (when not built yet) or entered here; [] if it can."""
    missing = _enter_missing()
    if not is_built(cache) and slurm_root._find("debootstrap") is None:
        missing.insert(0, "debootstrap")
    return missing


def _enter_missing() -> list[str]:
    missing = [
        name
        for name in slurm_root.HOST_TOOLS
        if name != "debootstrap" and slurm_root._find(name) is None
    ]
    if os.geteuid() != 0:
        missing.append("root (chroot and mount need it)")
    return missing


def _run_logged(argv: Sequence[str], log: Path, what: str, env: Mapping[str, str]) -> None:
    slurm_root.run_logged(
        argv, log, what, error=MaxTextEnvError, timeout_s=INSTALL_TIMEOUT_S, env=env, tail_lines=40
    )


@contextlib.contextmanager
def _host_install_files(root: Path) -> Iterator[None]:
    """The host's resolver and pip configuration in the root while pip runs, then removed."""
    copied = []
    for name in HOST_INSTALL_FILES:
        source, target = Path(name), root / name.lstrip("/")
        if source.exists() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            copied.append(target)
    try:
        yield
    finally:
        for target in copied:
            target.unlink(missing_ok=True)


def _in_root(root: Path, argv: Sequence[str]) -> list[str]:
    return slurm_root.enter_argv(root, argv)


def _install_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return env


def ensure_env(cache: Path | None = None) -> Path:
    """The root with its venv, built first if missing: debootstrap (about 40 s), then pip
    (about 2.5 min; docs/maxtext.md). Needs root. A failed build leaves nothing that looks
    built; one builder at a time."""
    root = root_dir(cache)
    if is_built(cache):
        return root
    with slurm_root.file_lock(root.with_name(root.name + ".lock")):
        if is_built(cache):
            return root
        missing = missing_tools(cache)
        if missing:
            raise MaxTextEnvError(f"cannot build {root}: missing {', '.join(missing)}")
        partial = root.with_name(root.name + ".partial")
        log = root.with_name(root.name + ".log")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        log.write_text(f"building {root}\n")
        env = _install_env()
        started = time.monotonic()
        debootstrap = slurm_root._find("debootstrap")
        assert debootstrap is not None  # checked above
        _run_logged(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={','.join(DEBIAN_PACKAGES)}",
                SUITE,
                str(partial),
                MIRROR,
            ],
            log,
            f"debootstrap {SUITE}",
            env,
        )
        rooted = time.monotonic()
        # minbase writes no /etc/hosts: "localhost" must resolve without DNS in the root.
        (partial / "etc" / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
        for deb in (partial / "var" / "cache" / "apt" / "archives").glob("*.deb"):
            deb.unlink()
        if HOST_CA_DIR.is_dir():
            target = partial / HOST_CA_DIR.relative_to("/")
            target.mkdir(parents=True, exist_ok=True)
            for crt in HOST_CA_DIR.glob("*.crt"):
                shutil.copyfile(crt, target / crt.name)
        with _host_install_files(partial):
            for what, argv in (
                ("update-ca-certificates", ["update-ca-certificates"]),
                ("python3.13 -m venv", ["python3.13", "-m", "venv", VENV]),
                (
                    "pip install",
                    [
                        f"{VENV}/bin/pip",
                        "install",
                        "--no-deps",
                        "--no-input",
                        "--progress-bar=off",
                        "-r",
                        str(CONSTRAINTS),
                    ],
                ),
            ):
                _run_logged(_in_root(partial, argv), log, what, env)
        # Checked where it runs: the pinned set imports, and so does rcpflow's recorder.
        _run_logged(
            _in_root(partial, job_argv(["-c", IMPORT_CHECK], python=PYTHON)),
            log,
            "the import check",
            env,
        )
        partial.rename(root)
        done = time.monotonic()
        (root / MARKER).write_text(
            f"root {rooted - started:.0f} s, venv {done - rooted:.0f} s, "
            f"built in {done - started:.0f} s\n"
        )
    return root


# What the environment must import: MaxText's trainer and converter, and rcpflow's recording.
IMPORT_CHECK = (
    "import maxtext.trainers.pre_train.train, maxtext.utils.generate_param_only_checkpoint, "
    "mlperf_logging.mllog, rcpflow.trainer.recorder, tpu_jobs.rcp.callbacks; print('ok')"
)


def job_argv(args: Sequence[str], *, python: str = PYTHON, cwd: str | None = None) -> list[str]:
    """The venv's Python with `args`, to run inside the root: in `cwd` (chroot starts in /;
    default: the repository) with the repository importable."""
    folder = cwd or str(_REPO)
    script = (
        'cd "$1" && shift && export PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}" && shift && '
        'exec "$@"'
    )
    return ["/bin/sh", "-c", script, "sh", folder, str(_REPO), python, *args]


def python_argv(
    args: Sequence[str], *, cache: Path | None = None, cwd: str | None = None,
    binds: Sequence[str] = (),
) -> list[str]:  # fmt: skip
    """A host command running the environment's Python with `args` (in `cwd`, default the
    repository). Folders outside the ones `slurm_root.bind_dirs` binds (``/tmp``, the
    repository's top folder) are bound when named in `binds`. The PID started is Python's."""
    return slurm_root.enter_argv(
        root_dir(cache), job_argv(args, cwd=cwd), binds=[*binds, *([cwd] if cwd else [])]
    )


def wrapper_script(cache: Path | None = None) -> str:
    """A shell script that runs the environment's Python with its arguments in the caller's
    folder (which must be below a bound folder: /tmp, the repository's top folder); inside the
    root already, it runs the venv's Python directly (``unshare`` does not nest there)."""
    root = root_dir(cache)

    def shell(argv: Sequence[str]) -> str:
        words = " ".join(shlex.quote(a) for a in argv)
        return words.replace(shlex.quote(_HERE), '"$PWD"')

    inside = job_argv([], cwd=_HERE)
    return (
        "#!/bin/sh\n"
        f"# MaxText's job Python (devtools/servers/maxtext_env.py): {PYTHON} in {root}\n"
        f'if [ -e /{MARKER} ]; then exec {shell(inside)} "$@"; fi\n'
        f'exec {shell(slurm_root.enter_argv(root, inside))} "$@"\n'
    )


_HERE = "@PWD@"  # the caller's folder, in `wrapper_script`


def write_wrapper(cache: Path | None = None) -> Path:
    """Write (atomically) the wrapper of the current environment at `wrapper_path`."""
    path = wrapper_path(cache)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(wrapper_script(cache))
    tmp.chmod(0o755)
    tmp.replace(path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.servers.maxtext_env",
        description="Build (once) MaxText's Python 3.13 job environment and print its wrapper.",
    )
    parser.parse_args(argv)
    try:
        ensure_env()
    except MaxTextEnvError as error:
        print(f"maxtext_env: {error}", file=sys.stderr)
        return 1
    print(write_wrapper())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
