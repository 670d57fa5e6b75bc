"""Multi-host training proven on CPU: two local processes of ``python -m tpu_jobs.train`` form
one `jax.distributed` system (coordinator on 127.0.0.1, gloo collectives) from the environment
a multi-host JobSet gives its pods, train together with one writer, and resume together."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rcpflow import manifest
from rcpflow.layout import RunLayout
from rcpflow.mllog import parse
from rcpflow.storage import storage_for
from tpu_jobs.rcp import distributed
from tpu_jobs.rcp.checkpoint_format import is_complete
from tpu_jobs.rcp.checkpoint_restore import restore_params

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
ARGS = ["--seed", "3", "--global-batch-size", "32", "--val-start-at", "2", "--max-steps", "4"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train(run_dir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tpu_jobs.train", "--run-dir", str(run_dir), *ARGS],
        cwd=REPO,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _slice(run_dir: Path, processes: int = 2) -> list[tuple[int, str, str]]:
    """Run the trainer as `processes` processes of one slice; (rc, stdout, stderr) of each."""
    port = _free_port()
    procs = [
        _train(
            run_dir,
            {
                distributed.COORDINATOR_ADDRESS_ENV: f"127.0.0.1:{port}",
                distributed.NUM_PROCESSES_ENV: str(processes),
                distributed.PROCESS_ID_ENV: str(i),
            },
        )
        for i in range(processes)
    ]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=400)  # a lost peer aborts only after a timeout
            results.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def _records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _steps(stdout: str) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["mean_reward"], r["loss"]) for r in _records(stdout) if "step" in r}


def _read(path: str) -> bytes:
    return storage_for(path).read_bytes(path)


@pytest.mark.slow
def test_two_processes_train_as_one_system_with_one_writer(tmp_path: Path) -> None:
    run_dir = tmp_path / "slice"
    results = _slice(run_dir)
    for i, (rc, out, err) in enumerate(results):
        assert rc == 0, f"process {i}:\n{out[-2000:]}\n{err[-4000:]}"
    starts = [next(r for r in _records(out) if r.get("event") == "start") for _, out, _ in results]
    assert [s["process"] for s in starts] == [[0, 2], [1, 2]]
    assert all(len(s["devices"]) == 2 for s in starts)  # one system: both processes' devices
    # every process ran every update of the same trajectory
    per_process = [_steps(out) for _, out, _ in results]
    assert sorted(per_process[0]) == [1, 2, 3, 4] and per_process[0] == per_process[1]

    layout = RunLayout(str(run_dir))
    # one writer: one training section, one manifest row per checkpointed step
    events = parse(storage_for(layout.mllog(3)).read_text(layout.mllog(3)), where="mllog")
    for key in ("init_start", "run_start", "block_start", "block_stop"):
        assert [e.key for e in events].count(key) == 1, key
    lines = _read(layout.manifest).decode().splitlines()
    assert len(lines) == 3
    rows = manifest.load(layout.manifest).rows
    assert [r.step for r in rows] == [2, 3, 4]
    for row in rows:
        assert is_complete(layout.checkpoint(row.step))
    params, meta = restore_params(layout.checkpoint(4), rows[-1].weights_fingerprint)
    assert meta.step == 4 and params

    # the same run on one process reaches the same weights: the system computes one trajectory
    single = tmp_path / "single"
    reference = _train(single, {})
    out, err = reference.communicate(timeout=400)
    assert reference.returncode == 0, err[-4000:]
    assert _steps(out) == per_process[0]
    single_rows = manifest.load(RunLayout(str(single)).manifest).rows
    assert [r.weights_fingerprint for r in single_rows] == [r.weights_fingerprint for r in rows]

    # rerun: both processes resume from the newest checkpoint (process 0 chose it), nothing
    # is written again
    log_before, manifest_before = _read(layout.mllog(3)), _read(layout.manifest)
    again = _slice(run_dir)
    for i, (rc, out, err) in enumerate(again):
        assert rc == 0, f"process {i}:\n{out[-2000:]}\n{err[-4000:]}"
        start = next(r for r in _records(out) if r.get("event") == "start")
        assert start["resumed_from"] == 4
        assert _steps(out) == {}
    assert _read(layout.mllog(3)) == log_before
    assert _read(layout.manifest) == manifest_before


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RCPFLOW_NUM_PROCESSES": "2"}, "RCPFLOW_COORDINATOR_ADDRESS, RCPFLOW_PROCESS_ID not set"),
        (
            {
                "RCPFLOW_COORDINATOR_ADDRESS": "h:1",
                "RCPFLOW_NUM_PROCESSES": "two",
                "RCPFLOW_PROCESS_ID": "0",
            },
            "RCPFLOW_NUM_PROCESSES='two' is not an integer",
        ),
        (
            {
                "RCPFLOW_COORDINATOR_ADDRESS": "h:1",
                "RCPFLOW_NUM_PROCESSES": "2",
                "RCPFLOW_PROCESS_ID": "2",
            },
            "RCPFLOW_PROCESS_ID=2 with RCPFLOW_NUM_PROCESSES=2: out of range",
        ),
        (
            {
                "RCPFLOW_COORDINATOR_ADDRESS": "no-port",
                "RCPFLOW_NUM_PROCESSES": "2",
                "RCPFLOW_PROCESS_ID": "1",
            },
            "RCPFLOW_COORDINATOR_ADDRESS='no-port' is not host:port",
        ),
    ],
)
def test_a_bad_layout_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(distributed.LayoutError) as excinfo:
        distributed.layout_from_env(env)
    assert message in str(excinfo.value)


def test_no_layout_is_one_process() -> None:
    layout = distributed.layout_from_env({"PATH": "/bin"})
    assert (layout.num_processes, layout.process_id, layout.multi_process) == (1, 0, False)
    three = distributed.layout_from_env(
        {
            "RCPFLOW_COORDINATOR_ADDRESS": "js-slice-0-0.js:8476",
            "RCPFLOW_NUM_PROCESSES": "32",
            "RCPFLOW_PROCESS_ID": "3",
        }
    )
    assert (three.num_processes, three.process_id, three.is_primary) == (32, 3, False)


def test_the_trainer_refuses_a_bad_layout_in_one_line(tmp_path: Path) -> None:
    proc = _train(tmp_path / "r", {"RCPFLOW_NUM_PROCESSES": "2"})
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert err.strip().splitlines() == [
        "python -m tpu_jobs.train: error: RCPFLOW_COORDINATOR_ADDRESS, RCPFLOW_PROCESS_ID not "
        "set (a multi-process job needs all of ('RCPFLOW_COORDINATOR_ADDRESS', "
        "'RCPFLOW_NUM_PROCESSES', 'RCPFLOW_PROCESS_ID'))"
    ]
    assert not (tmp_path / "r").exists()
