"""The Debian 13 root holding Slurm 24.11 (`devtools.servers.slurm_root`): its cache key
follows the package list; a bind mount never covers the root's own system; a program entered
in the root keeps the PID the harness holds (it is stopped by that PID), sees the host's
folders at the same paths, and leaves no mount on the host."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devtools.servers import slurm_root


def test_the_cache_key_follows_the_package_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = slurm_root.root_dir(tmp_path)
    monkeypatch.setattr(slurm_root, "PACKAGES", (*slurm_root.PACKAGES, "strace"))
    after = slurm_root.root_dir(tmp_path)
    assert before.parent == after.parent == tmp_path / "slurm-root"
    assert before != after and not slurm_root.is_built(tmp_path)


def test_a_bind_mount_never_covers_the_roots_system() -> None:
    binds = slurm_root.bind_dirs(["/usr/bin/python3", "/opt/tools/bin", "/etc/slurm"])
    assert {"/dev", "/proc", "/sys", "/tmp", "/opt"} <= set(binds)
    assert not {"/usr", "/etc", "/lib", "/var", "/bin"} & set(binds)
    assert f"/{Path(sys.prefix).resolve().parts[1]}" in binds  # the project's Python


def test_a_program_in_the_root_keeps_its_pid_and_mounts_nothing_here(tmp_path: Path) -> None:
    if not slurm_root.is_built():
        pytest.skip("the Slurm 24.11 root is not built (make system-packages builds it)")
    root = slurm_root.root_dir()
    marker = tmp_path / "marker"
    marker.write_text("host file\n")
    script = f"echo $$; cat {marker}; slurmctld -V; cat /etc/debian_version"
    proc = subprocess.Popen(
        slurm_root.enter_argv(root, ["/bin/sh", "-c", script]),
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=30)
    pid, seen, version, debian = out.split("\n")[:4]
    assert int(pid) == proc.pid  # the wrapper execs down to the program
    assert seen == "host file"
    assert version.startswith("slurm-wlm 24.11") and debian.startswith("13")
    assert str(root) not in Path("/proc/self/mountinfo").read_text()


def test_a_client_wrapper_runs_on_the_host_and_inside_the_root(tmp_path: Path) -> None:
    """Inside the root (a job's srun finds the wrapper on its PATH) the wrapper runs the
    program itself: a nested ``unshare`` fails there."""
    if not slurm_root.is_built():
        pytest.skip("the Slurm 24.11 root is not built (make system-packages builds it)")
    root = slurm_root.root_dir()
    wrapper = tmp_path / "slurmctld"
    wrapper.write_text(slurm_root.client_wrapper(root, "slurmctld"))
    wrapper.chmod(0o755)
    on_host = subprocess.run([str(wrapper), "-V"], capture_output=True, text=True, check=True)
    inside = subprocess.run(
        slurm_root.enter_argv(root, [str(wrapper), "-V"]),
        capture_output=True,
        text=True,
        check=True,
    )
    assert on_host.stdout.startswith("slurm-wlm 24.11") and inside.stdout == on_host.stdout
