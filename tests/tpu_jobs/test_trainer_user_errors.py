"""A training job's user errors are one line and an exit code, never a traceback, and leave the
run folder as it was (both trainers map them through `tpu_jobs.rcp.job_errors`).

Each probe breaks a copy of one finished run (conftest.py: `run`) and reruns the job with the
run's arguments: exit 2 for arguments that are not the run's (the line names the flag), 5 for a
run folder that cannot be resumed as it is (the line names the file). The toy's
``--resume-past-corrupt`` resumes past a newest checkpoint that cannot be restored: the step is
trained again (to the same weights: the trajectory is seeded) and its row replaced.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from file_tree import tree_bytes
from trainer_runs import TOY, Trainer, copy_of, finish_run, one_error_line, rows_of

from rcpflow.files import logtext
from rcpflow.files.layout import RunLayout
from rcpflow.records import manifest
from rcpflow.records.mllog import read_events
from tpu_jobs.rcp.job_errors import INVALID_INPUT

pytestmark = pytest.mark.timeout(900)


# ---- the contract of both trainers ----------------------------------------------------------


@pytest.mark.parametrize("flag", ["--max-steps", "--seed"])
def test_checkpoints_of_another_run_are_a_bad_argument(
    trainer: Trainer, run: Path, flag: str
) -> None:
    before = tree_bytes(run)
    if flag == "--seed":
        proc, needle = trainer.run(run, seed=trainer.seed + 1), f"--seed {trainer.seed + 1}"
    else:
        proc, needle = (
            trainer.run(run, max_steps=trainer.max_steps + 2),
            f"--max-steps {trainer.max_steps + 2}",
        )
    ours = {"--seed": trainer.seed, "--max-steps": trainer.max_steps}[flag]
    one_error_line(
        proc,
        trainer.prog,
        2,
        "checkpoint at",
        f"{needle} vs the run's {ours}",
        "use another run_dir",
    )
    assert tree_bytes(run) == before  # no MLLOG of the other seed either


def test_deleted_mllog(trainer: Trainer, run: Path) -> None:
    trainer.mllog(run).unlink()
    before = tree_bytes(run)
    one_error_line(
        trainer.run(run),
        trainer.prog,
        INVALID_INPUT,
        f"cannot resume at step {trainer.max_steps}",
        f"seed_{trainer.seed}.out is missing",
        "cannot be rebuilt",
    )
    assert tree_bytes(run) == before


@pytest.mark.parametrize(
    ("garbage", "needle"),
    [(b"garbage\n", "not JSON"), (b'{"step": "\xff"}\n', "not UTF-8")],
)
def test_garbage_manifest_line(trainer: Trainer, run: Path, garbage: bytes, needle: str) -> None:
    line = len(rows_of(run)) + 1
    with open(RunLayout(str(run)).manifest, "ab") as f:
        f.write(garbage)
    before = tree_bytes(run)
    one_error_line(
        trainer.run(run),
        trainer.prog,
        INVALID_INPUT,
        f"eval_checkpoints.jsonl: line {line}: {needle}",
    )
    assert tree_bytes(run) == before


def test_run_dir_that_is_a_file(trainer: Trainer, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.write_bytes(b"not a folder\n")
    # the path is named, and why (the toy: its checkpoints folder is not a directory; Tunix
    # takes the run folder's lease first: the folder cannot be made, a file is there)
    line = one_error_line(trainer.run(run_dir), trainer.prog, INVALID_INPUT, f"{run_dir}")
    assert ": Not a directory" in line or ": File exists" in line, line
    assert run_dir.read_bytes() == b"not a folder\n"
    assert sorted(tmp_path.iterdir()) == [run_dir]


# ---- the toy's own: its MLLOG cut short, its checkpoints broken -----------------------------


@pytest.fixture(scope="module")
def toy_finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finish_run(TOY, tmp_path_factory.mktemp("toy_finished") / "run")


@pytest.fixture
def toy_run(toy_finished: Path, tmp_path: Path) -> Path:
    return copy_of(toy_finished, tmp_path)


def train(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return TOY.run(run_dir, *extra)


def log_of(run_dir: Path) -> Path:
    return TOY.mllog(run_dir)


def refused(run_dir: Path, args: tuple[str, ...], *needles: str) -> str:
    """Train over `run_dir` with `args`: its one error line (exit INVALID_INPUT, holding every
    needle), the run folder left byte for byte as it was."""
    before = tree_bytes(run_dir)
    line = one_error_line(train(run_dir, *args), TOY.prog, INVALID_INPUT, *needles)
    assert tree_bytes(run_dir) == before
    return line


@pytest.mark.parametrize(
    ("cut", "needle"),
    [(0.5, "not an MLLOG event"), (0.2, "has no run_start/block_start")],
)
def test_truncated_mllog(toy_run: Path, cut: float, needle: str) -> None:
    data = log_of(toy_run).read_bytes()
    # 0.5: cut in the middle of a line; 0.2: at a line end, inside the header
    end = int(len(data) * cut) if cut == 0.5 else data.rfind(b"\n", 0, int(len(data) * cut)) + 1
    log_of(toy_run).write_bytes(data[:end])
    refused(toy_run, (), "cannot resume at step 4", needle)


def test_deleted_checkpoint_folder(toy_run: Path) -> None:
    shutil.rmtree(toy_run / "checkpoints" / "3")
    refused(toy_run, (), "step 3: manifest row points at", "not a complete checkpoint")


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


def test_corrupted_newest_checkpoint_is_resumed_past_with_the_flag(toy_run: Path) -> None:
    layout = RunLayout(str(toy_run))
    original = {r.step: r for r in manifest.load(layout.manifest).rows}
    corrupt(toy_run / "checkpoints" / "4")
    drop_block_stop(toy_run)
    line = refused(toy_run, (), "step 4: the newest checkpoint", "cannot be restored")
    assert "--resume-past-corrupt" in line  # without the flag nothing is touched

    proc = train(toy_run, "--resume-past-corrupt")
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert [p["step"] for p in printed if "step" in p] == [4]  # step 4 trained again, only it
    rows = {r.step: r for r in manifest.load(layout.manifest).rows}
    assert sorted(rows) == [2, 3, 4]
    assert rows[3] == original[3]
    # its row replaced: a new weight update, the same weights (the trajectory is seeded)
    assert rows[4].timestamp_ms > original[4].timestamp_ms
    assert rows[4].weights_fingerprint == original[4].weights_fingerprint
    (stop,) = [e for e in read_events(str(log_of(toy_run))) if e.key == "block_stop"]
    assert stop.time_ms == rows[4].timestamp_ms


def test_corrupted_last_checkpoint_of_an_ended_log_is_refused(toy_run: Path) -> None:
    corrupt(toy_run / "checkpoints" / "4")
    refused(toy_run, ("--resume-past-corrupt",), "cannot be restored", "has already ended")


def test_a_checkpoint_unlike_the_trainer_is_never_deleted_as_corrupt(toy_run: Path) -> None:
    """Restoring into the wrong structure fails too, but the checkpoint reads on its own: that
    is not corruption, and even --resume-past-corrupt must not delete it."""
    import jax.numpy as jnp

    from rcpflow import recipe
    from tpu_jobs.rcp.checkpoint_format import CheckpointError, is_complete
    from tpu_jobs.rcp.hooks import RcpHooks
    from tpu_jobs.toy.train import TrainConfig

    hp = recipe.hyperparameters(
        "open", 32, TOY.max_steps, learning_rate=TrainConfig.OPEN_LEARNING_RATE
    )
    hooks = RcpHooks(str(toy_run), 1, hp, 2)
    with pytest.raises(CheckpointError, match="reads on its own but not into this trainer"):
        hooks.resume(params_like={"w": jnp.zeros(3)}, state_like={}, past_corrupt=True)
    hooks.saver.close()
    assert is_complete(str(toy_run / "checkpoints" / "4"))
