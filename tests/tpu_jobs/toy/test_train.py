"""The training job end to end: run layout, MLLOG, flags, determinism and resume after a crash."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.records import manifest
from rcpflow.records.mllog import parse, run_start_ms
from rcpflow.verdict import stop_request
from tpu_jobs.rcp.callbacks import RcpHooks
from tpu_jobs.rcp.checkpoint_format import is_complete
from tpu_jobs.rcp.checkpoint_restore import read_meta
from tpu_jobs.toy import train
from tpu_jobs.toy.model import MODEL_CONFIG_KEY, ModelConfig

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[3]
FAST = ["--global-batch-size", "32", "--val-start-at", "2"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpu_jobs.train", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env=None if env is None else {**os.environ, **env},
    )  # fmt: skip


def events(run_dir: str, seed: int) -> list:
    path = RunLayout(run_dir).mllog(seed)
    return parse(storage_for(path).read_text(path), where=path)


def value(evs: list, key: str) -> object:
    (found,) = [e.value for e in evs if e.key == key]
    return found


def check_run(run_dir: str, seed: int, steps: list[int]) -> manifest.Manifest:
    layout = RunLayout(run_dir)
    loaded = manifest.load(layout.manifest)
    assert [r.step for r in loaded.rows] == steps and not loaded.stale_steps
    evs = events(run_dir, seed)
    start = run_start_ms(evs)
    stamps = [r.timestamp_ms for r in loaded.rows]
    assert start is not None and start <= stamps[0]
    assert stamps == sorted(set(stamps))  # strictly increasing
    (stop,) = [e for e in evs if e.key == "block_stop"]
    assert stop.time_ms == stamps[-1]  # backdated to the last weight update
    assert stop.metadata["step"] == steps[-1]
    assert stop.metadata["samples_count"] == steps[-1] * 32
    assert len([e for e in evs if e.key == "run_start"]) == 1
    for row in loaded.rows:
        assert is_complete(layout.checkpoint(row.step))
        assert row.samples_count == row.step * 32 and row.seed == seed
    return loaded


def test_cli_fast_run_writes_the_run_layout(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    proc = cli("--run-dir", run_dir, "--seed", "3", *FAST, "--max-steps", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = check_run(run_dir, 3, [2, 3, 4])
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    printed = {rec["step"]: rec["timestamp_ms"] for rec in lines if "step" in rec}
    assert sorted(printed) == [1, 2, 3, 4]
    assert [printed[r.step] for r in loaded.rows] == [r.timestamp_ms for r in loaded.rows]
    evs = events(run_dir, 3)
    # What is logged is what was used: the open division's toy learning rate.
    assert value(evs, "submission_division") == "open"
    assert value(evs, "opt_base_learning_rate") == train.TrainConfig.OPEN_LEARNING_RATE
    assert value(evs, "global_batch_size") == 32 and value(evs, "seed") == 3
    assert value(evs, "max_sequence_length") == ModelConfig().max_sequence_length == 65536
    # The evaluator rebuilds the model from the checkpoint's own record.
    meta = read_meta(RunLayout(run_dir).checkpoint(4))
    assert meta.extra[MODEL_CONFIG_KEY] == dataclasses.asdict(ModelConfig())
    assert meta.weights_fingerprint == loaded.rows[-1].weights_fingerprint


def test_resume_after_a_crash_continues_the_same_trajectory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def config(name: str) -> train.TrainConfig:
        return train.TrainConfig(
            run_dir=str(tmp_path / name), seed=1, global_batch_size=32, max_steps=5,
            val_start_at=2,
        )  # fmt: skip

    reference = train.train(config("reference"))
    assert reference.resumed_from is None and len(reference.mean_rewards) == 5

    original = RcpHooks.after_update

    def crash_at_4(self: RcpHooks, step: int, params: object, state: object) -> int:
        if step == 4:
            raise RuntimeError("simulated preemption before update 4 was recorded")
        return original(self, step, params, state)

    monkeypatch.setattr(RcpHooks, "after_update", crash_at_4)
    with pytest.raises(RuntimeError, match="simulated preemption"):
        train.train(config("crashed"))
    crashed = str(tmp_path / "crashed")
    assert [r.step for r in manifest.load(RunLayout(crashed).manifest).rows] == [2, 3]
    assert not [e for e in events(crashed, 1) if e.key == "block_stop"]
    monkeypatch.setattr(RcpHooks, "after_update", original)

    resumed = train.train(config("crashed"))
    assert (resumed.resumed_from, resumed.first_step) == (3, 4)
    assert resumed.mean_rewards == reference.mean_rewards[3:]
    got = check_run(crashed, 1, [2, 3, 4, 5])
    want = check_run(str(tmp_path / "reference"), 1, [2, 3, 4, 5])
    # Same seed, same weights at every step, whether or not the run was interrupted.
    assert [r.weights_fingerprint for r in got.rows] == [r.weights_fingerprint for r in want.rows]

    again = train.train(config("crashed"))  # a finished run: nothing more is trained or logged
    assert again.mean_rewards == () and again.resumed_from == 5
    check_run(crashed, 1, [2, 3, 4, 5])


def test_divisions_and_their_learning_rates(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--run-dir", "unused", "--seed", "0"]
    closed = train.parse_args([*base, "--division", "closed"]).hyperparameters()
    assert (closed.learning_rate, closed.gradient_clip_norm) == (1e-6, 0.125)
    opened = train.parse_args(base).hyperparameters()
    assert (
        opened.division == "open" and opened.learning_rate == train.TrainConfig.OPEN_LEARNING_RATE
    )
    chosen = train.parse_args([*base, "--learning-rate", "0.01"])
    assert chosen.hyperparameters().learning_rate == 0.01
    with pytest.raises(SystemExit) as exc:
        train.parse_args([*base, "--division", "closed", "--learning-rate", "3e-3"])
    assert exc.value.code == 2
    assert "closed division pins learning_rate" in capsys.readouterr().err


def test_model_size_flags_shape_the_model() -> None:
    base = ["--run-dir", "unused", "--seed", "0"]
    assert train.parse_args(base).model == ModelConfig()
    sized = train.parse_args([*base, "--d-model", "32", "--d-ff", "48", "--num-layers", "3"])
    assert sized.model == ModelConfig(d_model=32, d_ff=48, num_layers=3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-steps", "10"], "--max-steps 10 is below the validation start step 18"),
        (["--global-batch-size", "40"], "global_batch_size must be a positive multiple of 16"),
        (["--val-start-at", "0"], "--val-start-at must be positive"),
    ],
)
def test_bad_flags_are_refused_by_name(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        train.parse_args(["--run-dir", "unused", "--seed", "0", *args])
    assert message in capsys.readouterr().err


@pytest.mark.gcs
def test_cli_on_gcs(gcs, gcs_prefix: str) -> None:
    run_dir = f"{gcs_prefix}/run"
    proc = cli("--run-dir", run_dir, "--seed", "2", *FAST, "--max-steps", "3", env=gcs.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_run(run_dir, 2, [2, 3])


@pytest.mark.parametrize("seed_of_request", [1, 2])
def test_a_stop_request_ends_training_after_the_current_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed_of_request: int
) -> None:
    """The orchestrator asks to stop once step 3 is evaluated (the request appears while step
    4 is trained, naming step 3's committed checkpoint): the trainer ends after step 4 with
    every queued save committed and its row written, block_stop at step 4's update. A request
    naming another run (seed 2) is ignored: training runs to max_steps."""
    run_dir = str(tmp_path / "run")
    original = RcpHooks.after_update

    def update_then_request(self: RcpHooks, step: int, params: Any, state: Any) -> int:
        timestamp_ms = original(self, step, params, state)
        if step == 4:
            self.flush()  # the saves of steps 2..4 committed, with their rows
            row = manifest.load(RunLayout(run_dir).manifest).row(3)
            start = run_start_ms(events(run_dir, 1))
            identity = stop_request.RunIdentity(seed_of_request, 32, 2, 8, start)
            request = stop_request.StopRequest(
                identity, step=3, timestamp_ms=row.timestamp_ms, reason="test"
            )
            Path(RunLayout(run_dir).stop_request).write_bytes(request.to_json())
        return timestamp_ms

    monkeypatch.setattr(RcpHooks, "after_update", update_then_request)
    config = train.TrainConfig(run_dir=run_dir, seed=1, global_batch_size=32, max_steps=8,
                               val_start_at=2)  # fmt: skip
    result = train.train(config)
    last = 4 if seed_of_request == 1 else 8
    assert result.last_step == last and len(result.mean_rewards) == last
    check_run(run_dir, 1, list(range(2, last + 1)))  # complete checkpoints, rows, block_stop


def _abandoned(filename: str, message: str = "DATA_LOSS") -> logging.LogRecord:
    """asyncio's record of a task whose exception (`message`) nobody retrieved, raised in code
    at `filename`."""
    code = compile(f"def read():\n    raise ValueError({message!r})\n", filename, "exec")
    scope: dict[str, Any] = {}
    exec(code, scope)
    try:
        scope["read"]()
    except ValueError as e:
        assert e.__traceback__ is not None
        exc_info = (ValueError, e, e.__traceback__.tb_next)  # from `read` on, as asyncio logs it
    return logging.LogRecord(
        "asyncio", logging.ERROR, "base_events.py", 1,
        "Task exception was never retrieved\nfuture: <Task finished>", None, exc_info,
    )  # fmt: skip


def test_only_abandoned_orbax_reads_are_dropped_from_asyncio_s_log() -> None:
    from tpu_jobs.toy.train import AbandonedRestoreReads

    quiet = AbandonedRestoreReads()
    orbax = os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "serialization.py")
    assert not quiet.filter(_abandoned(orbax))
    assert quiet.filter(_abandoned(os.path.join(os.sep, "work", "mine.py")))  # not Orbax's
    # a tensorstore read Orbax handed asyncio as is: asyncio's frames alone, the spec named
    wrapped = os.path.join(os.path.dirname(asyncio.__file__), "tasks.py")
    read_error = "DATA_LOSS: Error opening \"zarr\" driver [tensorstore_spec='{}']"
    assert not quiet.filter(_abandoned(wrapped, read_error))
    assert quiet.filter(_abandoned(wrapped))  # asyncio's frames, but no tensorstore read
    other = logging.LogRecord("asyncio", logging.ERROR, "x.py", 1, "Executing <Task>", None, None)
    assert quiet.filter(other)
