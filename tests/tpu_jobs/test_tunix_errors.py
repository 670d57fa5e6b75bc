"""The Tunix job's user errors are one line and an exit code, never a traceback (as the toy
trainer's, test_d5_trainer_errors.py; both map them through `tpu_jobs.job_errors`).

Each probe breaks a copy of one tiny finished Tunix run and reruns ``python -m
tpu_jobs.tunix_train``: exit 2 for arguments that are not the run's (the line names the flag), 1
for a run folder that cannot be resumed as it is (the line names the file), and every byte under
the run folder left as it was. All are refused before Tunix builds its model.

Skipped only when the ``tunix`` extra is not installed (CI installs it with ``.[all]``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from file_tree import tree_bytes

from rcpflow.layout import RunLayout

pytest.importorskip(
    "tpu_jobs.tunix.train", reason="google-tunix (the project's `tunix` extra) is not installed"
)

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
ENV = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
PROG = "python -m tpu_jobs.tunix_train"
SEED, MAX_STEPS = 0, 3
ARGS = ["--global-batch-size", "32", "--val-start-at", "2"]  # checkpoints of steps 2 and 3


def tunix_train(
    run_dir: Path, *, seed: int = SEED, max_steps: int = MAX_STEPS
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpu_jobs.tunix_train", "--run-dir", str(run_dir),
         "--seed", str(seed), "--max-steps", str(max_steps), *ARGS],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env={**os.environ, **ENV, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("tunix_errors") / "run"
    proc = tunix_train(run_dir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def one_error_line(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out[-4000:]
    assert proc.returncode == code, out[-4000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith(PROG)]
    assert len(errors) == 1, proc.stderr[-4000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "needle"),
    [({"max_steps": 4}, "--max-steps 4 vs the run's 3"), ({"seed": 1}, "--seed 1 vs the run's 0")],
)
def test_checkpoints_of_another_run_are_a_bad_argument(
    run: Path, flags: dict[str, int], needle: str
) -> None:
    before = tree_bytes(run)
    proc = tunix_train(run, **flags)
    one_error_line(proc, 2, "step 2: checkpoint at", needle, "use another run_dir")
    assert tree_bytes(run) == before  # no MLLOG of the other seed either


@pytest.mark.slow
def test_deleted_mllog(run: Path) -> None:
    Path(RunLayout(str(run)).mllog(SEED)).unlink()
    before = tree_bytes(run)
    one_error_line(
        tunix_train(run), 1, "cannot resume at step 3", "seed_0.out is missing", "cannot be rebuilt"
    )
    assert tree_bytes(run) == before


@pytest.mark.slow
def test_garbage_manifest_line(run: Path) -> None:
    with open(RunLayout(str(run)).manifest, "ab") as f:
        f.write(b"garbage\n")
    before = tree_bytes(run)
    one_error_line(tunix_train(run), 1, "eval_checkpoints.jsonl: line 3: not JSON")
    assert tree_bytes(run) == before


def test_run_dir_that_is_a_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.write_bytes(b"not a folder\n")
    one_error_line(tunix_train(run_dir), 1, f"{run_dir}/mllog: Not a directory")
    assert run_dir.read_bytes() == b"not a folder\n"
    assert sorted(tmp_path.iterdir()) == [run_dir]
