"""Running the `rcpflow` CLI as a user does, and the bad-input contract its answers must keep.

`run_cli` runs ``python -m rcpflow`` with this checkout importable (also from another working
folder) and its output captured; `assert_one_invalid_line` is the contract for bad input: one
stderr line ``invalid: ...`` naming the thing, exit 1, no traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def cli_env(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout on PYTHONPATH, plus `extra`."""
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def cli_env_without_gcs_credentials(home: Path) -> dict[str, str]:
    """`cli_env()` with no way to Google Cloud credentials: no GOOGLE_*, emulator or gcloud
    variables, `home` as HOME, no application-default credentials file and no metadata
    server."""
    env = {
        k: v
        for k, v in cli_env().items()
        if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR", "GCE_", "CLOUDSDK_"))
    }
    env.update(
        HOME=str(home),
        CLOUDSDK_CONFIG=str(home / "gcloud"),  # no application-default credentials file
        NO_GCE_CHECK="true",  # and no metadata-server probe (nor a reachable one, if it ran)
        GCE_METADATA_HOST="127.0.0.1:9",
        GCE_METADATA_IP="127.0.0.1:9",
        GCE_METADATA_TIMEOUT="1",
    )
    return env


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """``python -m rcpflow ARGS``; `env` replaces the whole environment (default `cli_env()`)."""
    return subprocess.run(
        [sys.executable, "-m", "rcpflow", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(env) if env is not None else cli_env(),
        **kw,
    )


def assert_one_invalid_line(
    p: subprocess.CompletedProcess[str], *needles: str, prefix: str = "invalid: "
) -> str:
    """`p` refused bad input (or, with `prefix` ``error: ``, failed) as the contract says; the
    line, which names every needle."""
    out = p.stdout + p.stderr
    assert "Traceback" not in out, out
    assert p.returncode == 1, out
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix), out
    for needle in needles:
        assert needle in lines[0], out
    return lines[0]
