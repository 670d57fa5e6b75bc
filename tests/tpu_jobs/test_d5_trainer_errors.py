"""D5 (issue 10): the trainer's user errors are one line and an exit code, never a traceback.

Each probe breaks a copy of one finished fast run and reruns `python -m tpu_jobs.train` with the
run's arguments: exit 2 for arguments that are not the run's, 1 for a run folder that cannot be
resumed as it is, and the folder left as it was. A newest checkpoint that cannot be restored is
resumed past with ``--resume-past-corrupt``: the step is trained again (to the same weights: the
trajectory is seeded) and its row replaced.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from file_tree import tree_bytes

from rcpflow import logtext, manifest
from rcpflow.layout import RunLayout
from rcpflow.mllog import read_events

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
ARGS = ["--seed", "1", "--global-batch-size", "32", "--val-start-at", "2"]
MAX_STEPS = 4


def train(run_dir: Path, *extra: str, max_steps: int = MAX_STEPS) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tpu_jobs.train", "--run-dir", str(run_dir), *ARGS,
         "--max-steps", str(max_steps), *extra],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("d5") / "run"
    proc = train(run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def one_error_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out[-3000:]
    assert proc.returncode == code, out[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("python -m tpu_jobs.train")]
    assert len(errors) == 1, proc.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def log_of(run_dir: Path) -> Path:
    return Path(RunLayout(str(run_dir)).mllog(1))


def test_d5_resume_with_another_max_steps_is_a_bad_argument(run: Path) -> None:
    before = tree_bytes(run)
    proc = train(run, max_steps=6)
    one_error_line(proc, 2, "--max-steps 6 vs the run's 4", "use another run_dir")
    assert tree_bytes(run) == before


def test_d5_deleted_mllog(run: Path) -> None:
    log_of(run).unlink()
    before = tree_bytes(run)
    one_error_line(train(run), 1, "seed_1.out is missing", "it cannot be rebuilt")
    assert tree_bytes(run) == before


@pytest.mark.parametrize(
    ("cut", "needle"),
    [(0.5, "not an MLLOG event"), (0.2, "has no run_start/block_start")],
)
def test_d5_truncated_mllog(run: Path, cut: float, needle: str) -> None:
    data = log_of(run).read_bytes()
    # 0.5: cut in the middle of a line; 0.2: at a line end, inside the header
    end = int(len(data) * cut) if cut == 0.5 else data.rfind(b"\n", 0, int(len(data) * cut)) + 1
    log_of(run).write_bytes(data[:end])
    before = tree_bytes(run)
    one_error_line(train(run), 1, "cannot resume at step 4", needle)
    assert tree_bytes(run) == before


def test_d5_deleted_checkpoint_folder(run: Path) -> None:
    shutil.rmtree(run / "checkpoints" / "3")
    before = tree_bytes(run)
    one_error_line(train(run), 1, "step 3: manifest row points at", "not a complete checkpoint")
    assert tree_bytes(run) == before


@pytest.mark.parametrize(
    ("garbage", "needle"),
    [(b"garbage\n", "line 4: not JSON"), (b'{"step": "\xff"}\n', "line 4: not UTF-8")],
)
def test_d5_garbage_manifest_line(run: Path, garbage: bytes, needle: str) -> None:
    with open(RunLayout(str(run)).manifest, "ab") as f:
        f.write(garbage)
    before = tree_bytes(run)
    one_error_line(train(run), 1, "eval_checkpoints.jsonl: " + needle)
    assert tree_bytes(run) == before


def corrupt(step_dir: Path) -> None:
    """Overwrite bytes inside every params data file (what a bad disk or copy would do)."""
    for data in (step_dir / "params").rglob("d/*"):
        with open(data, "r+b") as f:
            f.seek(10)
            f.write(b"garbage!")


def drop_block_stop(run_dir: Path) -> None:
    """The trainer crashed after the last checkpoint, before ending the log."""
    lines = logtext.lines(logtext.read(str(log_of(run_dir))), keepends=True)
    log_of(run_dir).write_bytes(
        logtext.encode("".join(ln for ln in lines if "block_stop" not in ln))
    )


def test_d5_corrupted_newest_checkpoint_is_resumed_past_with_the_flag(run: Path) -> None:
    layout = RunLayout(str(run))
    original = {r.step: r for r in manifest.load(layout.manifest).rows}
    corrupt(run / "checkpoints" / "4")
    drop_block_stop(run)
    before = tree_bytes(run)
    line = one_error_line(train(run), 1, "step 4: the newest checkpoint", "cannot be restored")
    assert "--resume-past-corrupt" in line
    assert tree_bytes(run) == before  # without the flag nothing is touched

    proc = train(run, "--resume-past-corrupt")
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert [p["step"] for p in printed if "step" in p] == [4]  # step 4 trained again, only it
    rows = {r.step: r for r in manifest.load(layout.manifest).rows}
    assert sorted(rows) == [2, 3, 4]
    assert rows[3] == original[3]
    # its row replaced: a new weight update, the same weights (the trajectory is seeded)
    assert rows[4].timestamp_ms > original[4].timestamp_ms
    assert rows[4].weights_fingerprint == original[4].weights_fingerprint
    (stop,) = [e for e in read_events(str(log_of(run))) if e.key == "block_stop"]
    assert stop.time_ms == rows[4].timestamp_ms


def test_d5_corrupted_last_checkpoint_of_an_ended_log_is_refused(run: Path) -> None:
    corrupt(run / "checkpoints" / "4")
    before = tree_bytes(run)
    one_error_line(
        train(run, "--resume-past-corrupt"), 1, "cannot be restored", "has already ended"
    )
    assert tree_bytes(run) == before


def test_d5_a_checkpoint_unlike_the_trainer_is_never_deleted_as_corrupt(run: Path) -> None:
    """Restoring into the wrong structure fails too, but the checkpoint reads on its own: that
    is not corruption, and even --resume-past-corrupt must not delete it."""
    import jax.numpy as jnp

    from rcpflow import recipe
    from tpu_jobs.rcp.checkpoint_format import CheckpointError, is_complete
    from tpu_jobs.rcp.hooks import RcpHooks
    from tpu_jobs.toy.train import TrainConfig

    hp = recipe.hyperparameters("open", 32, MAX_STEPS, learning_rate=TrainConfig.OPEN_LEARNING_RATE)
    hooks = RcpHooks(str(run), 1, hp, 2)
    with pytest.raises(CheckpointError, match="reads on its own but not into this trainer"):
        hooks.resume(params_like={"w": jnp.zeros(3)}, state_like={}, past_corrupt=True)
    hooks.saver.close()
    assert is_complete(str(run / "checkpoints" / "4"))
