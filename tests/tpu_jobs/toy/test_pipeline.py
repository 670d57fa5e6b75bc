"""End to end through the job CLIs: train -> evaluate every saved step -> `rcpflow finalize`.

On a local folder (the real default policy at gbs 256, with the validation start moved close to
max_steps so the test stays short) and on the GCS emulator (a tiny batch), plus a training
process killed in the middle of its checkpointing and re-run.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.records import manifest
from rcpflow.records.mllog import read_events, run_start_ms
from rcpflow.records.summary import read_summary
from rcpflow.records.summary_checks import validity_problems
from tpu_jobs.rcp.checkpoint_restore import read_meta, restore_params
from tpu_jobs.rcp.checkpoint_writer import CheckpointSaver
from tpu_jobs.toy import grpo
from tpu_jobs.toy.model import ModelConfig, unscan_params
from tpu_jobs.toy.train import TrainConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[3]
# See test_rcp_callbacks: file mtimes come from a clock that can lag time.time() by one tick.
COARSE_CLOCK_NS = int(time.clock_getres(5) * 1e9)  # 5 = CLOCK_REALTIME_COARSE


def run(
    args: list[str], env: dict[str, str] | None, timeout: int = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def train(run_dir: str, *flags: str, env: dict[str, str] | None = None) -> list[dict]:
    proc = run(["-m", "tpu_jobs.train", "--run-dir", run_dir, "--seed", "0", *flags], env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def evaluate_all(run_dir: str, env: dict[str, str] | None = None) -> list[manifest.ManifestRow]:
    rows = list(manifest.load(RunLayout(run_dir).manifest).rows)
    for row in rows:
        proc = run(["-m", "tpu_jobs.evaluate", "--run-dir", run_dir, "--step", str(row.step)], env)
        assert proc.returncode == 0, f"step {row.step}: {proc.stderr[-4000:]}"
    return rows


def finalize(run_dir: str, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "rcpflow"), "finalize", run_dir],
        capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def check_timestamps(run_dir: str, rows: list[manifest.ManifestRow], local: bool) -> None:
    events = read_events(RunLayout(run_dir).mllog(0))
    start = run_start_ms(events)
    assert start is not None
    stamps = [r.timestamp_ms for r in rows]
    assert all(b > a for a, b in itertools.pairwise(stamps))  # strictly increasing
    assert stamps[0] > start
    [block_stop] = [e for e in events if e.key == "block_stop"]
    assert block_stop.time_ms == stamps[-1]  # backdated to the last weight update
    if local:
        for row in rows:
            files = [p for p in Path(row.checkpoint_path).rglob("*") if p.is_file()]
            first_write = min(p.stat().st_mtime_ns for p in files)
            assert row.timestamp_ms * 1_000_000 < first_write + COARSE_CLOCK_NS, row.step


def check_verdict(run_dir: str, rows: list[manifest.ManifestRow], verdict: dict) -> None:
    """The verdict is the first step above target (or aborted at the last), run_stop at its
    weight-update timestamp, one eval_accuracy per evaluated step, nothing fabricated."""
    summaries = {r.step: read_summary(RunLayout(run_dir).summary(r.step)) for r in rows}
    for row in rows:
        assert validity_problems(summaries[row.step], row) == []
    passing = [r for r in rows if summaries[r.step].eval_accuracy > r.target_accuracy]
    end = passing[0] if passing else rows[-1]
    assert verdict == {
        "status": "success" if passing else "aborted",
        "step": end.step,
        "samples_count": end.samples_count,
        "time_ms": end.timestamp_ms,
    }
    events = read_events(RunLayout(run_dir).mllog(0))
    [run_stop] = [e for e in events if e.key == "run_stop"]
    assert run_stop.time_ms == end.timestamp_ms
    accuracies = [e for e in events if e.key == "eval_accuracy"]
    assert [e.metadata["samples_count"] for e in accuracies] == [
        r.samples_count for r in rows if r.step <= end.step
    ]


def check_two_restore_paths_agree(row: manifest.ManifestRow, cfg: ModelConfig) -> None:
    """The evaluator's path (numpy + per-layer views) sees the weights the trainer's resume path
    restores (jax arrays in the scanned layout)."""
    hp = TrainConfig(run_dir="unused", seed=0, max_steps=row.max_steps).hyperparameters()
    like = grpo.init_state(cfg, hp, 0)
    saver = CheckpointSaver(str(Path(row.checkpoint_path).parent))
    scanned, _, _ = saver.restore_train_state(row.step, like.params, like.opt_state)
    saver.close()
    params, _ = restore_params(row.checkpoint_path, row.weights_fingerprint)
    outer, layers = unscan_params(params, axis=cfg.param_scan_axis)
    for name, value in outer.items():
        for a, b in zip(_leaves(value), _leaves(scanned[name]), strict=True):
            np.testing.assert_array_equal(a, np.asarray(b))
    for i, layer in enumerate(layers):
        for view, stacked in zip(_leaves(layer), _leaves(scanned["layers"]), strict=True):
            np.testing.assert_array_equal(view, np.take(np.asarray(stacked), i, axis=1))


def _leaves(tree: object) -> list:
    import jax

    return jax.tree.leaves(tree)


def test_local_pipeline_default_policy(tmp_path) -> None:
    run_dir = str(tmp_path / "run")
    updates = train(run_dir, "--max-steps", "30", "--val-start-at", "24")
    assert [u["step"] for u in updates if "step" in u] == list(range(1, 31))
    rows = evaluate_all(run_dir)
    assert [r.step for r in rows] == list(range(24, 31))
    check_timestamps(run_dir, rows, local=True)
    verdict = finalize(run_dir)
    check_verdict(run_dir, rows, verdict)
    check_two_restore_paths_agree(rows[-1], ModelConfig())
    # A second finalize of the same inputs writes the same bytes.
    log = Path(RunLayout(run_dir).mllog(0)).read_bytes()
    assert finalize(run_dir) == verdict
    assert Path(RunLayout(run_dir).mllog(0)).read_bytes() == log


@pytest.mark.gcs
def test_gcs_pipeline_tiny_batch(gcs, gcs_prefix) -> None:
    run_dir = f"{gcs_prefix}/run"
    flags = ("--global-batch-size", "32", "--max-steps", "6", "--val-start-at", "3")
    train(run_dir, *flags, env=gcs.env)
    rows = evaluate_all(run_dir, env=gcs.env)
    assert [r.step for r in rows] == [3, 4, 5, 6]
    assert all(r.checkpoint_path == f"{run_dir}/checkpoints/{r.step}" for r in rows)
    check_timestamps(run_dir, rows, local=False)
    verdict = finalize(run_dir, env=gcs.env)
    check_verdict(run_dir, rows, verdict)
    attempts = storage_for(run_dir).list(RunLayout(run_dir).attempts_dir(3))
    assert attempts == [f"{RunLayout(run_dir).attempts_dir(3)}/attempts.jsonl"]


# The toy trainer, SIGKILLed by itself as process 0 starts waiting for step KILL_AT's commit
# (steps before it handed on with their rows, that one being written by Orbax): a crash
# mid-checkpointing at a known point, not a race with the clock.
KILL_WHILE_SAVING = """
import os, signal, sys
from tpu_jobs.rcp.checkpoint_writer import CheckpointSaver
from tpu_jobs.toy import train
watch = CheckpointSaver._watch
def watch_or_die(self, job):
    if job.step == int(os.environ["KILL_AT"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return watch(self, job)
CheckpointSaver._watch = watch_or_die
sys.exit(train.main(sys.argv[1:]))
"""


def test_training_killed_while_checkpointing_resumes_consistently(tmp_path) -> None:
    run_dir = str(tmp_path / "run")
    layout = RunLayout(run_dir)
    flags = ["--global-batch-size", "32", "--max-steps", "40", "--val-start-at", "3"]
    proc = subprocess.run(
        [sys.executable, "-c", KILL_WHILE_SAVING, "--run-dir", run_dir, "--seed", "0", *flags],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "KILL_AT": "5"},
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    # Consistent right after the crash: rows only for complete checkpoints, contiguous.
    rows = list(manifest.load(layout.manifest).rows)
    assert [r.step for r in rows] == [3, 4]  # each save's row comes before the next save starts
    for row in rows:
        assert read_meta(row.checkpoint_path).weights_fingerprint == row.weights_fingerprint
    killed_rows = {r.step: r for r in rows}

    updates = train(run_dir, *flags)
    [start] = [u for u in updates if u.get("event") == "start"]
    assert start["resumed_from"] is not None and start["resumed_from"] >= rows[-1].step
    rows = list(manifest.load(layout.manifest).rows)
    assert [r.step for r in rows] == list(range(3, 41))
    for step, row in killed_rows.items():
        assert rows[step - 3] == row  # rows written before the crash are kept as they were
    assert sorted(os.listdir(layout.checkpoints_dir)) == sorted(str(s) for s in range(3, 41))
    check_timestamps(run_dir, rows, local=True)
    keys = [e.key for e in read_events(layout.mllog(0))]
    assert keys.count("run_start") == 1 and keys.count("block_stop") == 1
    # The resumed checkpoints evaluate like any other.
    resumed_step = start["resumed_from"] + 1
    for step in (resumed_step, 40):
        proc = run(["-m", "tpu_jobs.evaluate", "--run-dir", run_dir, "--step", str(step)], None)
        assert proc.returncode == 0, proc.stderr[-3000:]
