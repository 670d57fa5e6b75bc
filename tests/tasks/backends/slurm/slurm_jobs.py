"""Jobs of someone else on the private Slurm, for the tests of what rcpflow refuses to touch:
a local user (`other_user`, made with ``useradd`` when missing) and held jobs submitted as that
user by root (``sbatch --uid``), cancelled after each test."""

from __future__ import annotations

import getpass
import pwd
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from devtools.servers.slurm_cluster import SlurmCluster

OTHER_USER = "rcpflowother"


@pytest.fixture(scope="session")
def other_user() -> str:
    """A second local account (root makes it once: useradd, no home)."""
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        if getpass.getuser() != "root" or shutil.which("useradd") is None:
            pytest.skip(f"no user {OTHER_USER!r} and no root useradd to make one")
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", OTHER_USER], check=True)
    if getpass.getuser() != "root":
        pytest.skip("submitting as another user (sbatch --uid) needs root")
    return OTHER_USER


def submit_held(
    slurm: SlurmCluster, *, name: str, output: str, user: str | None = None, comment: str = ""
) -> str:
    """A held job (it never runs) of `name` writing to `output`, as `user` (else as us),
    with `comment`; its id."""
    argv = ["sbatch", "--parsable", "--hold", f"--job-name={name}", f"--output={output}"]
    if user is not None:
        argv.append(f"--uid={user}")
    if comment:
        argv.append(f"--comment={comment}")
    return slurm.client(*argv, "--wrap=true").strip().split(";")[0]


@pytest.fixture
def foreign_jobs(slurm: SlurmCluster) -> Iterator[list[str]]:
    """The ids of the held jobs a test submitted (append them): scancelled after it."""
    ids: list[str] = []
    yield ids
    if ids:
        slurm.client("scancel", *ids)
