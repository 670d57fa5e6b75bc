"""Running a program to its end with its output captured: no stdin, stdout and stderr as one
stream of bytes in the order written, never a shell, the exit status returned (not raised).

`subprocess.TimeoutExpired` propagates when `timeout_s` passes; the caller decides what that means.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from typing import Any


def run_captured(
    argv: Sequence[str],
    *,
    timeout_s: float,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    **popen: Any,
) -> subprocess.CompletedProcess[bytes]:
    """`argv` run to its end; `popen` passes further `subprocess.run` arguments (user, group)."""
    return subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout_s,
        check=False,
        **popen,
    )
