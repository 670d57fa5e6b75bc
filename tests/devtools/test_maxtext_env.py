"""MaxText's job environment (`devtools.servers.maxtext_env`): its cache key follows the
package lists; its Python (3.13, in the Debian 13 root) runs in the caller's folder with the
repository importable, keeps the PID the harness holds, and leaves no mount on the host."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from devtools.servers import maxtext_env


def test_the_cache_key_follows_the_pinned_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = maxtext_env.root_dir(tmp_path)
    changed = tmp_path / "constraints.txt"
    changed.write_text(maxtext_env.CONSTRAINTS.read_text() + "six==1.17.0\n")
    monkeypatch.setattr(maxtext_env, "CONSTRAINTS", changed)
    after = maxtext_env.root_dir(tmp_path)
    assert before.parent == after.parent == tmp_path / "maxtext-env"
    assert before != after and not maxtext_env.is_built(tmp_path)
    monkeypatch.setattr(maxtext_env, "DEBIAN_PACKAGES", (*maxtext_env.DEBIAN_PACKAGES, "strace"))
    assert maxtext_env.root_dir(tmp_path) not in (before, after)
    assert maxtext_env.wrapper_path(tmp_path) == tmp_path / "maxtext-env" / "python"


def test_every_pin_is_name_equals_version() -> None:
    lines = [
        ln for ln in maxtext_env.CONSTRAINTS.read_text().splitlines() if not ln.startswith("#")
    ]
    names = [ln.split("==")[0].lower() for ln in lines]
    assert all(ln.count("==") == 1 for ln in lines)
    assert len(set(names)) == len(names)
    assert {"maxtext", "jax", "jaxlib", "mlperf-logging", "google-cloud-storage"} <= set(names)
    assert "pytype" not in names  # no cp313 wheel: maxtext[tpu] as a whole does not install


def test_the_environments_python_runs_here_with_the_repository(tmp_path: Path) -> None:
    if not maxtext_env.is_built() or maxtext_env.missing_tools():
        pytest.skip("MaxText's environment is not built (make system-packages builds it, as root)")
    wrapper = maxtext_env.write_wrapper()
    script = (
        "import json, os, sys, tpu_jobs; print(json.dumps([os.getpid(), os.getcwd(), "
        "list(sys.version_info[:2]), tpu_jobs.__file__]))"
    )
    proc = subprocess.Popen(
        [str(wrapper), "-c", script], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    out, _ = proc.communicate(timeout=60)
    pid, cwd, version, package = json.loads(out)
    assert pid == proc.pid  # the wrapper execs down to Python
    assert cwd == str(tmp_path) and version == [3, 13]
    assert package == str(maxtext_env._REPO / "tpu_jobs" / "__init__.py")
    assert str(maxtext_env.root_dir()) not in Path("/proc/self/mountinfo").read_text()
