"""The two trainers as subprocesses (`Trainer`, `TOY`, `TUNIX`) and small readers of what a job
left: its one error line, a run folder's manifest rows; `copy_of` a finished run. The fixtures
are in conftest.py."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rcpflow.files.layout import RunLayout
from rcpflow.records import manifest
from rcpflow.records.manifest import ManifestRow

REPO = Path(__file__).resolve().parents[2]
HAS_TUNIX = importlib.util.find_spec("tunix") is not None


@dataclass(frozen=True)
class Trainer:
    """One training job as a user runs it: ``python -m <module> --run-dir D --seed S ...``."""

    name: str
    module: str
    seed: int
    max_steps: int
    val_start_at: int
    global_batch_size: int = 32
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 300

    @property
    def prog(self) -> str:
        return f"python -m {self.module}"

    def run(
        self, run_dir: Path, *extra: str, seed: int | None = None, max_steps: int | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", self.module, "--run-dir", str(run_dir),
             "--seed", str(self.seed if seed is None else seed),
             "--global-batch-size", str(self.global_batch_size),
             "--val-start-at", str(self.val_start_at),
             "--max-steps", str(self.max_steps if max_steps is None else max_steps), *extra],
            capture_output=True, text=True, timeout=self.timeout_s, cwd=REPO,
            env={**os.environ, **self.env, "PYTHONPATH": str(REPO)},
        )  # fmt: skip

    def mllog(self, run_dir: Path) -> Path:
        return Path(RunLayout(str(run_dir)).mllog(self.seed))


TOY = Trainer("toy", "tpu_jobs.train", seed=1, max_steps=4, val_start_at=2)
TUNIX = Trainer(
    "tunix",
    "tpu_jobs.tunix_train",
    seed=0,
    max_steps=3,
    val_start_at=2,
    env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"},
    timeout_s=600,
)
NO_TUNIX = pytest.mark.skipif(
    not HAS_TUNIX, reason="google-tunix (the project's `tunix` extra) is not installed"
)


def one_error_line(
    proc: subprocess.CompletedProcess[str], prog: str, code: int, *needles: str
) -> str:
    """The one ``<prog>: error:`` line of a job that exited `code` without a traceback."""
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out[-4000:]
    assert proc.returncode == code, out[-4000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith(prog)]
    assert len(errors) == 1, proc.stderr[-4000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of the run folder `run_dir` as ``<tmp_path>/run``, for one test to change."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy


def rows_of(run_dir: str | Path) -> list[ManifestRow]:
    """The run's manifest rows, read and validated as finalize reads them."""
    return list(manifest.load(RunLayout(str(run_dir)).manifest).rows)


def written_rows(run_dir: str | Path) -> list[ManifestRow]:
    """The rows as written so far, not validated (none before the first): for polling a run
    that is still writing."""
    return manifest.read_rows(RunLayout(str(run_dir)).manifest)


def finish_run(trainer: Trainer, run_dir: Path) -> Path:
    proc = trainer.run(run_dir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir
