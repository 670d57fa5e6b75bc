"""Running MaxText's environment from the tests (`MaxTextEnv`; the fixture is in conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devtools.servers import maxtext_env

REPO = Path(__file__).resolve().parents[3]
IN_ENV = Path(__file__).resolve().parent / "in_env.py"


@dataclass(frozen=True)
class MaxTextEnv:
    """Runs the environment's Python from the repository, as a job runs."""

    def run(
        self, args: Sequence[str], *, binds: Sequence[str] = (), timeout_s: float = 600
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            maxtext_env.python_argv(args, cwd=str(REPO), binds=binds),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
            check=False,
        )

    def helper(self, command: str, run_dir: Path, number: int) -> dict:
        """One command of in_env.py; its JSON answer."""
        proc = self.run([str(IN_ENV), command, str(run_dir), str(number)], binds=[str(run_dir)])
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
