"""The Tunix GRPO job (google-tunix 0.1.7): recording inside Tunix's loop, Tunix's checkpoints,
their evaluation, finalize and the official checker, and a SIGKILL followed by a rerun.

Skipped only when the ``tunix`` extra is not installed (CI installs it with ``.[all]``).
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
from typing import Any

import jax
import pytest
from flax import nnx
from trainer_runs import rows_of

from rcpflow.files.layout import RunLayout
from rcpflow.records.mllog import read_events, run_start_ms
from rcpflow.records.summary import read_summary
from rcpflow.records.summary_checks import validity_problems
from rcpflow.submission.checkers import compliance
from rcpflow.trainer.recorder import TrainingRecorder
from tpu_jobs.eval.orchestration import evaluate as evaluate_target
from tpu_jobs.eval.target import Target
from tpu_jobs.rcp.checkpoint_format import is_complete

_WHY = "google-tunix (the project's `tunix` extra) is not installed"
rlc = pytest.importorskip("tunix.rl.rl_cluster", reason=_WHY)
checkpoints = pytest.importorskip("tpu_jobs.tunix.checkpoints", reason=_WHY)
evaluate = pytest.importorskip("tpu_jobs.tunix.evaluate", reason=_WHY)
train = pytest.importorskip("tpu_jobs.tunix.train", reason=_WHY)
recording = pytest.importorskip("tpu_jobs.tunix.recording", reason=_WHY)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[3]
ENV = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
SHORT = ["--max-steps", "4", "--val-start-at", "2"]


def run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
        env={**os.environ, **ENV, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def cli_train(run_dir: str, *flags: str) -> list[dict]:
    proc = run(["-m", "tpu_jobs.tunix_train", "--run-dir", run_dir, "--seed", "0", *flags])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_recording_points_inside_tunix_loop(tmp_path: Path, monkeypatch: Any) -> None:
    """Instrumented in-process run: each update's timestamp is taken once its parameters are
    computed and before the next step's rollout; each row is written after its commit."""
    events: list[tuple[Any, ...]] = []
    recordings: list[recording.StepRecording] = []

    init = recording.StepRecording.__init__

    def capture(self: recording.StepRecording, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        recordings.append(self)

    on_update = TrainingRecorder.on_update

    def observe_update(self: TrainingRecorder, step: int, timestamp_ms: int | None = None) -> int:
        trainer = recordings[-1].trainer
        leaves = jax.tree.leaves(nnx.state(trainer.model, nnx.Param))
        ready = all(leaf.is_ready() for leaf in leaves)
        recorded = on_update(self, step, timestamp_ms)
        events.append(("update", step, recorded, ready, trainer.train_steps))
        return recorded

    committed = TrainingRecorder.on_checkpoint_committed

    def observe_row(self: TrainingRecorder, step: int, path: str, extra: Any) -> Any:
        folder = checkpoints.step_path(str(tmp_path / "run" / "checkpoints"), step)
        events.append(("row", step, is_complete(folder)))
        return committed(self, step, path, extra)

    generate = rlc.RLCluster.generate

    def observe_generate(self: rlc.RLCluster, *args: Any, **kwargs: Any) -> Any:
        events.append(("rollout", time.time_ns() // 1_000_000, self.actor_trainer.train_steps))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(recording.StepRecording, "__init__", capture)
    monkeypatch.setattr(TrainingRecorder, "on_update", observe_update)
    monkeypatch.setattr(TrainingRecorder, "on_checkpoint_committed", observe_row)
    monkeypatch.setattr(rlc.RLCluster, "generate", observe_generate)
    train.train(
        train.TrainConfig(run_dir=str(tmp_path / "run"), seed=0, max_steps=4, val_start_at=2)
    )

    updates = [e for e in events if e[0] == "update"]
    assert [e[1] for e in updates] == [1, 2, 3, 4]
    assert all(ready and steps == step for _, step, _, ready, steps in updates)
    rollouts = [i for i, e in enumerate(events) if e[0] == "rollout"]
    assert len(rollouts) == 4 and [events[i][2] for i in rollouts] == [0, 1, 2, 3]
    for step in (1, 2, 3):
        at = events.index(updates[step - 1])
        nxt = rollouts[step]  # the rollout of step + 1
        assert at < nxt and events[nxt][1] >= updates[step - 1][2]
    assert [e[1:] for e in events if e[0] == "row"] == [(2, True), (3, True), (4, True)]


def test_short_run_evaluated_finalized_and_checked(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    layout = RunLayout(run_dir)
    out = cli_train(run_dir, *SHORT)
    assert [o["step"] for o in out if "step" in o] == [1, 2, 3, 4]
    rows = rows_of(run_dir)
    assert [r.step for r in rows] == [2, 3, 4]
    events = read_events(layout.mllog(0))
    start = run_start_ms(events)
    assert start is not None and [e.key for e in events].count("run_start") == 1
    stamps = [r.timestamp_ms for r in rows]
    assert stamps[0] > start and all(b > a for a, b in itertools.pairwise(stamps))
    [block_stop] = [e for e in events if e.key == "block_stop"]
    assert block_stop.time_ms == stamps[-1] and block_stop.metadata["step"] == 4
    assert not any(e.key == "run_stop" for e in events)
    # Tunix's checkpoints: its actor/<step> layout, only steps from val_start_at, its metadata.
    root = os.path.join(run_dir, "checkpoints")
    assert sorted(os.listdir(os.path.join(root, "actor"))) == ["2", "3", "4"]
    for row in rows:
        assert row.checkpoint_path == os.path.join(root, "actor", str(row.step))
        meta = json.loads(Path(row.checkpoint_path, "_CHECKPOINT_METADATA").read_text())
        assert meta["custom_metadata"]["global_step"] == row.step
        assert meta["custom_metadata"]["role"] == "actor"
        assert meta["custom_metadata"]["rcpflow"]["timestamp_ms"] == row.timestamp_ms
        assert meta["custom_metadata"]["rcpflow"]["weights_fingerprint"] == row.weights_fingerprint
        assert {"model_params", "optimizer_state"} <= set(os.listdir(row.checkpoint_path))

    for row in rows:
        proc = run(["-m", "tpu_jobs.tunix_evaluate", "--run-dir", run_dir, "--step", str(row.step)])
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert validity_problems(read_summary(layout.summary(row.step)), row) == []
    attempts = Path(layout.attempts_dir(2), "attempts.jsonl").read_bytes()
    # Deterministic: the standalone mode on the same checkpoint samples the same attempts.
    alone = tmp_path / "alone"
    proc = run(["-m", "tpu_jobs.tunix_evaluate", "--checkpoint", rows[0].checkpoint_path,
                "--output-dir", str(alone), "--rcp-logging"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (alone / "attempts" / "attempts.jsonl").read_bytes() == attempts
    assert validity_problems(read_summary(str(alone / "summary.json")), rows[0]) == []

    proc = run(["-m", "rcpflow", "finalize", run_dir], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = json.loads(proc.stdout.splitlines()[-1])
    summaries = {r.step: read_summary(layout.summary(r.step)) for r in rows}
    passing = [r for r in rows if summaries[r.step].eval_accuracy > r.target_accuracy]
    end = passing[0] if passing else rows[-1]
    assert verdict["status"] == ("success" if passing else "aborted")
    assert verdict["step"] == end.step and verdict["time_ms"] == end.timestamp_ms
    check = compliance(layout.mllog(0), division="open", log_dir=str(tmp_path / "checks"))
    if passing:
        assert check.ok, check
    else:  # an aborted run is a well-formed log that the checker rejects for its accuracy only
        assert not check.ok and check.errors == (
            f"Failed checks for eval_accuracy : v['value'] > {rows[0].target_accuracy}",
        ), check


def test_evaluation_refuses_weights_that_are_not_the_recorded_ones(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    cli_train(run_dir, "--max-steps", "2", "--val-start-at", "2")
    [row] = rows_of(run_dir)
    target = Target(
        checkpoint_path=row.checkpoint_path,
        expected_fingerprint="sha256:" + "0" * 64,
        step=row.step,
        timestamp_ms=row.timestamp_ms,
        samples_count=row.samples_count,
        target_accuracy=row.target_accuracy,
        summary_path=str(tmp_path / "bad" / "summary.json"),
        attempts_dir=str(tmp_path / "bad" / "attempts"),
    )
    summary = evaluate_target(target, evaluate.TunixCheckpoints()).summary
    assert summary is not None
    assert summary.fatal_error is not None and "fingerprint" in summary.fatal_error
    assert validity_problems(summary, row) != []


# The Tunix job, SIGKILLed by itself right after the row of step KILL_AFTER is written (later
# steps' saves may be in flight): a crash mid-run at a known point, not a race with the clock.
KILL_AFTER_ROW = """
import os, signal, sys
from tpu_jobs.tunix import recording, train
committed = recording.StepRecording._committed
def committed_then_die(self, step, path):
    committed(self, step, path)
    if step == int(os.environ["KILL_AFTER"]):
        os.kill(os.getpid(), signal.SIGKILL)
recording.StepRecording._committed = committed_then_die
sys.exit(train.main(sys.argv[1:]))
"""


def test_killed_mid_run_resumes_with_a_consistent_manifest(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    layout = RunLayout(run_dir)
    flags = ["--max-steps", "30", "--val-start-at", "3"]
    proc = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_ROW, "--run-dir", run_dir, "--seed", "0", *flags],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, **ENV, "PYTHONPATH": str(REPO), "KILL_AFTER": "5"},
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    before = rows_of(run_dir)
    assert [r.step for r in before] == [3, 4, 5]  # the watcher writes rows in step order
    for row in before:
        assert is_complete(row.checkpoint_path)

    out = cli_train(run_dir, *flags)
    [start] = [o for o in out if o.get("event") == "start"]
    assert start["resumed_from"] is not None and start["resumed_from"] >= before[-1].step
    after = rows_of(run_dir)
    assert [r.step for r in after] == list(range(3, 31))
    for row in before:
        assert after[row.step - 3] == row  # rows written before the kill are kept as they were
    lines = Path(layout.manifest).read_text().splitlines()
    assert len(lines) == len(after)  # no duplicate rows
    events = read_events(layout.mllog(0))
    assert [e.key for e in events].count("run_start") == 1
    [block_stop] = [e for e in events if e.key == "block_stop"]
    assert block_stop.time_ms == after[-1].timestamp_ms
