"""Multi-host evaluation proven on CPU: one evaluation worker as local processes of
``python -m tpu_jobs.evaluate`` (started by `tpu_jobs.launch`, or by hand with its environment)
forming one `jax.distributed` system, on a checkpoint that two training processes wrote. Each
process restores only the shards its devices hold, they sample together, process 0 alone writes,
and a failure on one process is the same failure on all."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from trainer_runs import copy_of
from trainer_runs import finish_job as _finish
from trainer_runs import launch_job as _launch

from rcpflow.files.layout import RunLayout
from rcpflow.records import manifest
from rcpflow.records.summary import read_summary
from rcpflow.records.summary_checks import validity_problems
from rcpflow.verdict import gate
from tpu_jobs.eval import cli as eval_cli
from tpu_jobs.eval.orchestration import ATTEMPTS_FILE
from tpu_jobs.launch import free_port, process_env
from tpu_jobs.rcp import distributed
from tpu_jobs.rcp.checkpoint_restore import restore_params
from tpu_jobs.rcp.fingerprint import leaf_name

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("no_jax_compilation_cache")]

REPO = Path(__file__).resolve().parents[3]
DRIVER = Path(__file__).with_name("multihost_eval_driver.py")
STEP = 3
PROCESSES, DEVICES = 2, 2
EVAL_TIMES = ("eval_start_ms", "eval_stop_ms")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def _evaluate_cmd(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "tpu_jobs.evaluate", "--run-dir", str(run_dir), "--step", "3"]


def _launched(*command: str) -> subprocess.CompletedProcess[str]:
    """`command` as one worker of PROCESSES x DEVICES through the launcher."""
    return subprocess.run(
        [sys.executable, "-m", "tpu_jobs.launch", "--processes", str(PROCESSES),
         "--devices-per-process", str(DEVICES), "--grace-s", "5", "--", *command],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run trained by 2 processes x 2 devices: checkpoints (and rows) of steps 2 and 3."""
    run_dir = tmp_path_factory.mktemp("multihost_eval") / "run"
    rc, _, err = _finish(_launch(run_dir, PROCESSES, DEVICES, "--max-steps", str(STEP)))
    assert rc == 0, err[-4000:]
    return run_dir


@pytest.fixture
def run(trained: Path, tmp_path: Path) -> Path:
    return copy_of(trained, tmp_path)


def _row(run_dir: Path) -> manifest.ManifestRow:
    return manifest.load(RunLayout(str(run_dir)).manifest).row(STEP)


@pytest.mark.slow
def test_two_processes_evaluate_exactly_as_one(trained: Path, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    shutil.copytree(trained, one)
    shutil.copytree(trained, two)
    single = subprocess.run(
        _evaluate_cmd(one), cwd=REPO, env=_env(JAX_PLATFORMS="cpu"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    multi = _launched(*_evaluate_cmd(two))
    assert multi.returncode == 0, multi.stderr[-3000:]
    # Process 0 alone reports (and writes); the other says nothing on stdout.
    assert len([ln for ln in multi.stdout.splitlines() if ln.startswith("step 3:")]) == 1

    layouts = RunLayout(str(one)), RunLayout(str(two))
    attempts = [Path(lay.attempts_dir(STEP), ATTEMPTS_FILE).read_bytes() for lay in layouts]
    assert attempts[0] == attempts[1]  # every sampled token, reward and status
    assert [os.listdir(lay.attempts_dir(STEP)) for lay in layouts] == [[ATTEMPTS_FILE]] * 2
    summaries = [json.loads(Path(lay.summary(STEP)).read_text()) for lay in layouts]
    for s in summaries:
        for key in EVAL_TIMES:  # when each ran: the only fields that may differ
            s.pop(key)
    assert summaries[0] == summaries[1]
    summary = read_summary(layouts[1].summary(STEP))
    assert validity_problems(summary, _row(two)) == []
    assert summary.complete and summary.fatal_error is None


@pytest.mark.slow
def test_each_process_restores_only_the_shards_its_devices_hold(
    trained: Path, tmp_path: Path
) -> None:
    row = _row(trained)
    proc = _launched(sys.executable, str(DRIVER), row.checkpoint_path, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("process_*.json"))]
    held = {r["process"]: r for r in records}
    assert sorted(held) == [0, 1]
    full, meta = restore_params(row.checkpoint_path, row.weights_fingerprint)  # numpy, whole
    flat = {
        leaf_name(path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(full)[0]
    }
    devices = PROCESSES * DEVICES
    split_leaves, held_bytes, total_bytes = 0, [0, 0], 0
    for name, array in flat.items():
        total_bytes += array.nbytes
        split = [a for a, d in enumerate(array.shape) if d % devices == 0 and d > 1]
        for p in (0, 1):
            leaf = held[p]["leaves"][name]
            assert leaf["shape"] == list(array.shape)
            assert not leaf["fully_addressable"]  # a global array over both processes
            assert len(leaf["shards"]) == DEVICES  # one per local device
            for shard in leaf["shards"]:
                index = tuple(slice(a, b) for a, b in shard["index"])
                part = np.ascontiguousarray(array[index])
                assert shard["sha256"] == hashlib.sha256(part.tobytes()).hexdigest()
                held_bytes[p] += part.nbytes
        if not split:  # replicated, as in training: every shard is the whole leaf
            assert all(
                [b - a for a, b in s["index"]] == list(array.shape)
                for p in (0, 1)
                for s in held[p]["leaves"][name]["shards"]
            )
            continue
        split_leaves += 1
        # Split over the 4 devices in process order: process 0 the first half, 1 the second.
        axis = max(split, key=lambda a: (array.shape[a], -a))
        quarter = array.shape[axis] // devices
        for p in (0, 1):
            starts = sorted(s["index"][axis][0] for s in held[p]["leaves"][name]["shards"])
            assert starts == [(p * DEVICES + d) * quarter for d in range(DEVICES)], name
    assert split_leaves > 0
    assert all(b < total_bytes for b in held_bytes)  # neither holds the whole model
    assert meta.step == held[0]["step"] == held[1]["step"] == STEP


def _corrupt_process_1_shards(run_dir: Path) -> list[Path]:
    """Truncate the data files training process 1 wrote for step 3's params: the shards the
    evaluation's process 1 reads (same layout), none of process 0's."""
    files = list(Path(_row(run_dir).checkpoint_path, "params", "ocdbt.process_1", "d").iterdir())
    assert files
    for f in files:
        f.write_bytes(f.read_bytes()[:10])
    return files


@pytest.mark.slow
def test_a_corrupted_shard_fails_every_process_the_same_way(run: Path) -> None:
    _corrupt_process_1_shards(run)
    port, base = free_port(), dict(_env())
    procs = []
    for i in range(PROCESSES):
        env = process_env(base, i, PROCESSES, port, DEVICES)
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        procs.append(subprocess.Popen(_evaluate_cmd(run), cwd=REPO, env=env, **pipes))
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=300)  # never a hang
        finally:
            if p.poll() is None:
                p.kill()
        results.append((p.returncode, out, err))
    assert [rc for rc, _, _ in results] == [eval_cli.EXIT_FATAL] * PROCESSES, results
    errors = [
        [ln for ln in e.splitlines() if ln.startswith("error: step 3:")] for _, _, e in results
    ]
    assert [len(e) for e in errors] == [1, 1], errors
    assert "restore failed on another process of this job" in errors[0][0]
    assert "process 1 of 2: CheckpointError:" in errors[1][0]
    assert "restore failed:" in errors[1][0] and _row(run).checkpoint_path in errors[1][0]
    layout = RunLayout(str(run))
    summary = read_summary(layout.summary(STEP))
    assert summary.fatal_error is not None and "restore failed" in summary.fatal_error
    assert gate.valid_summary(layout.root, _row(run)) is None  # the run can never end on it
    assert not Path(layout.attempts_dir(STEP), ATTEMPTS_FILE).exists()


class _OneProcessLoader:
    batch_rows = 8
    multi_process = False

    def load(self, path: str, expected_fingerprint: str | None) -> object:
        raise AssertionError("a refused layout restores nothing")


def test_an_evaluator_of_one_process_refuses_a_multi_process_layout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv(distributed.COORDINATOR_ADDRESS_ENV, "127.0.0.1:1")
    monkeypatch.setenv(distributed.NUM_PROCESSES_ENV, "2")
    monkeypatch.setenv(distributed.PROCESS_ID_ENV, "0")
    args = ["--run-dir", str(tmp_path), "--step", "3"]
    with pytest.raises(SystemExit) as excinfo:
        eval_cli.main(args, _OneProcessLoader(), prog="ev", description="d")  # type: ignore[arg-type]
    assert excinfo.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()[-1:]
    assert "RCPFLOW_NUM_PROCESSES=2: this evaluator runs one process per worker" in line
    monkeypatch.delenv(distributed.PROCESS_ID_ENV)
    with pytest.raises(SystemExit) as excinfo:
        eval_cli.main(args, _OneProcessLoader(), prog="ev", description="d")  # type: ignore[arg-type]
    assert excinfo.value.code == 2
    assert "RCPFLOW_PROCESS_ID not set" in capsys.readouterr().err
