"""Multi-host training proven on CPU: local processes of ``python -m tpu_jobs.train`` started by
`tpu_jobs.launch` form one `jax.distributed` system (coordinator on 127.0.0.1, gloo collectives)
from the environment a multi-host JobSet gives its pods, train one sharded step, save each
checkpoint together with one writer of the log and manifest, stop together and resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_runs import MULTIHOST_ARGS as ARGS
from trainer_runs import finish_job as _finish
from trainer_runs import launch_job as _launch
from trainer_runs import records as _records
from trainer_runs import rows_of, written_rows

from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.records.mllog import parse, read_events, run_start_ms
from rcpflow.records.run_identity import RunIdentity
from rcpflow.records.summary import read_summary
from rcpflow.trainer.job_exit import EXIT_SIGTERM
from rcpflow.verdict.stop_request import StopRequest
from tpu_jobs.rcp import distributed
from tpu_jobs.rcp.checkpoint_format import is_complete
from tpu_jobs.rcp.checkpoint_restore import restore_params
from tpu_jobs.toy.train import SLOW_AFTER_UPDATE_ENV

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("no_jax_compilation_cache")]

REPO = Path(__file__).resolve().parents[3]
SEED = 3


def _launch_slowed(run_dir: Path, max_steps: int, slow_s: float) -> subprocess.Popen[str]:
    """2 processes x 2 devices, a full state every 2 steps, process 1 sleeping `slow_s` after
    each update."""
    return _launch(
        run_dir, 2, 2, "--max-steps", str(max_steps), "--full-state-every", "2",
        env={SLOW_AFTER_UPDATE_ENV: f"1:{slow_s}"},
    )  # fmt: skip


def _read(path: str) -> bytes:
    return storage_for(path).read_bytes(path)


def _children(pid: int) -> dict[int, int]:
    """{RCPFLOW_PROCESS_ID: pid} of the launcher's children."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            for item in environ:
                if item.startswith(distributed.PROCESS_ID_ENV.encode() + b"="):
                    found[int(item.split(b"=", 1)[1])] = int(child)
    return found


def _wait_for_row(run_dir: Path, step: int, proc: subprocess.Popen[str]) -> None:
    path = RunLayout(str(run_dir)).manifest
    deadline = time.monotonic() + 360  # generous: 2 cores shared with two other workers
    while time.monotonic() < deadline and proc.poll() is None:
        if storage_for(path).exists(path) and step in [r.step for r in written_rows(run_dir)]:
            return
        time.sleep(0.05)
    raise AssertionError(f"no row {step} (launcher rc {proc.poll()})")


def _consistent(run_dir: Path, last: int) -> list:
    """Rows val_start..last, each naming a complete checkpoint whose weights verify."""
    rows = rows_of(run_dir)
    assert [r.step for r in rows] == list(range(2, last + 1))
    for row in rows:
        assert is_complete(row.checkpoint_path)
    _, meta = restore_params(rows[-1].checkpoint_path, rows[-1].weights_fingerprint)
    assert (meta.step, meta.timestamp_ms) == (rows[-1].step, rows[-1].timestamp_ms)
    return rows


def _training_keys(run_dir: Path) -> list[str]:
    layout = RunLayout(str(run_dir))
    return [e.key for e in parse(_read(layout.mllog(SEED)).decode(), where="mllog")]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_processes_shard_the_step_save_together_and_stop_together(tmp_path: Path) -> None:
    """2 processes x 2 devices, process 1 slowed after each update, a full state every 2
    steps: the step has collectives; each process feeds its own rows; one log and one row per
    step; each checkpoint holds both processes' shards; process 0's timestamp follows process
    1's late update; a stop request stops both at the same step; one process evaluates a
    checkpoint of the two; a rerun changes nothing."""
    run_dir = tmp_path / "run"
    proc = _launch_slowed(run_dir, 30, slow_s=0.4)
    _wait_for_row(run_dir, 3, proc)
    [row3] = [r for r in written_rows(run_dir) if r.step == 3]
    start = run_start_ms(read_events(RunLayout(str(run_dir)).mllog(SEED)))
    request = StopRequest(
        run=RunIdentity.of_row(row3, start), step=3, timestamp_ms=row3.timestamp_ms, reason="test"
    )
    layout = RunLayout(str(run_dir))
    storage_for(layout.stop_request).write_atomic(layout.stop_request, request.to_json())
    rc, out, err = _finish(proc)
    assert rc == 0, err[-4000:]

    starts = sorted((r for r in out if r.get("event") == "start"), key=lambda r: r["process"])
    assert [s["process"] for s in starts] == [[0, 2], [1, 2]]
    assert all(len(s["devices"]) == 4 for s in starts)  # one system: both processes' devices
    assert {"all-reduce", "all-gather"} & set(starts[0]["collectives"])
    assert [s["rows"] for s in starts] == [[0, 2], [2, 4]]  # 4 prompts a step, 2 each

    stops = [r for r in out if r.get("event") == "stop_requested"]
    assert sorted(r["process"] for r in stops) == [0, 1]
    assert stops[0]["step"] == stops[1]["step"]
    last = stops[0]["step"]
    assert 3 <= last < 30
    steps = {p: [r["step"] for r in out if "loss" in r and r["process"] == p] for p in (0, 1)}
    assert steps[0] == steps[1] == list(range(1, last + 1))

    # Process 0 took each timestamp after process 1's update had finished (it slept 0.4 s).
    slow = {r["step"]: r["time_ms"] for r in out if r.get("event") == "slow_update_done"}
    stamps = {r["step"]: r["timestamp_ms"] for r in out if "loss" in r and r["process"] == 0}
    assert sorted(slow) == list(range(1, last + 1))
    assert all(stamps[s] >= slow[s] for s in slow), (stamps, slow)

    rows = _consistent(run_dir, last)
    assert [r.timestamp_ms for r in rows] == [stamps[r.step] for r in rows]
    keys = _training_keys(run_dir)
    for key in ("init_start", "run_start", "block_start", "block_stop"):
        assert keys.count(key) == 1, key
    for row in rows:
        files = os.listdir(Path(row.checkpoint_path) / "params")
        assert {"ocdbt.process_0", "ocdbt.process_1"} <= set(files), files
        has_state = (Path(row.checkpoint_path) / "train_state").exists()
        assert has_state == (row.step % 2 == 0), row.step  # full state at 2, 4, ...

    # One process evaluates a checkpoint the two wrote, verifying the row's fingerprint.
    ev = subprocess.run(
        [sys.executable, "-m", "tpu_jobs.evaluate", "--run-dir", str(run_dir), "--step", "3"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ev.returncode == 0, ev.stderr[-3000:]
    summary = read_summary(layout.summary(3))
    assert summary.fatal_error is None and summary.complete

    # A rerun: both resume the ended run, nothing is written again.
    before = _read(layout.mllog(SEED)), _read(layout.manifest)
    rc, out, err = _finish(_launch(run_dir, 2, 2, "--max-steps", "30", "--full-state-every", "2"))
    assert rc == 0, err[-4000:]
    assert [r["resumed_from"] for r in out if r.get("event") == "start"] == [last, last]
    assert not [r for r in out if "loss" in r]
    assert (_read(layout.mllog(SEED)), _read(layout.manifest)) == before


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_process_killed_then_a_rerun_resumes_from_the_last_full_state(tmp_path: Path) -> None:
    """kill -9 of process 1 mid-run: the launcher ends the other and exits 137; the rerun
    resumes from the newest full state (every 2 steps), trains the weights-only steps after it
    again with new rows, and the run ends with one row per step, each naming its checkpoint."""
    run_dir = tmp_path / "run"
    proc = _launch_slowed(run_dir, 8, slow_s=0.3)
    _wait_for_row(run_dir, 5, proc)
    os.kill(_children(proc.pid)[1], signal.SIGKILL)
    rc, _, _ = _finish(proc)
    assert rc == 128 + signal.SIGKILL
    before = {r.step: r for r in written_rows(run_dir)}
    assert 5 in before and max(before) < 8
    rc, out, err = _finish(_launch(run_dir, 2, 2, "--max-steps", "8", "--full-state-every", "2"))
    assert rc == 0, err[-4000:]
    resumed = {r["resumed_from"] for r in out if r.get("event") == "start"}
    [point] = resumed
    assert point % 2 == 0 and 4 <= point <= max(before)  # a full-state step
    rows = _consistent(run_dir, 8)
    for row in rows:
        _, meta = restore_params(row.checkpoint_path, row.weights_fingerprint)
        assert meta.timestamp_ms == row.timestamp_ms
        kept = before.get(row.step)
        if row.step <= point:
            assert kept is not None
            assert (row.timestamp_ms, row.weights_fingerprint) == (
                kept.timestamp_ms, kept.weights_fingerprint,
            )  # fmt: skip
        else:  # trained again: a new row for the new checkpoint
            assert kept is None or row.timestamp_ms > kept.timestamp_ms
    assert _training_keys(run_dir).count("block_stop") == 1


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_sigterm_to_one_of_four_processes_stops_all_at_the_same_step(tmp_path: Path) -> None:
    """4 processes x 1 device: SIGTERM reaches process 2 only; all four stop after the same
    step, finish their saves and exit 143; every completed step has its row."""
    run_dir = tmp_path / "run"
    proc = _launch(run_dir, 4, 1, "--max-steps", "40", env={SLOW_AFTER_UPDATE_ENV: "3:0.2"})
    _wait_for_row(run_dir, 2, proc)
    os.kill(_children(proc.pid)[2], signal.SIGTERM)
    rc, out, err = _finish(proc)
    assert rc == EXIT_SIGTERM, err[-4000:]
    assert "Traceback" not in err
    starts = [r for r in out if r.get("event") == "start"]
    assert sorted(tuple(s["rows"]) for s in starts) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert all(s["collectives"] for s in starts)
    terms = [r for r in out if r.get("event") == "sigterm"]
    assert sorted(r["process"] for r in terms) == [0, 1, 2, 3]
    [last] = {r["step"] for r in terms}
    _consistent(run_dir, last)
    assert "block_stop" not in _training_keys(run_dir)  # an unfinished run ends nothing


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
    assert (three.num_processes, three.process_id, three.multi_process) == (32, 3, True)


def test_the_trainer_refuses_a_bad_layout_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpu_jobs.train", "--run-dir", str(tmp_path / "r"), *ARGS],
        cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu", "RCPFLOW_NUM_PROCESSES": "2"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert err.strip().splitlines() == [
        "python -m tpu_jobs.train: error: RCPFLOW_COORDINATOR_ADDRESS, RCPFLOW_PROCESS_ID not "
        "set (a multi-process job needs all of ('RCPFLOW_COORDINATOR_ADDRESS', "
        "'RCPFLOW_NUM_PROCESSES', 'RCPFLOW_PROCESS_ID'))"
    ]
    assert not (tmp_path / "r").exists()


def test_a_batch_that_does_not_split_over_the_devices_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tpu_jobs.train", "--run-dir", str(tmp_path / "r"), "--seed", "0",
         "--global-batch-size", "48", "--val-start-at", "2", "--max-steps", "3"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
             "XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "python -m tpu_jobs.train: error: --global-batch-size / 16 prompts: 3 rows per step "
        "cannot be split evenly over 2 devices (1 processes)"
    )


def test_the_launcher_sets_the_layout_and_returns_the_first_failure(tmp_path: Path) -> None:
    # Each prints its layout and leaves a mark; process 1 fails once all three have printed,
    # the others would sleep on.
    script = (
        "import json, os, sys, time; i = int(os.environ['RCPFLOW_PROCESS_ID']); "
        "sys.stdout.write(json.dumps({k: os.environ[k] for k in ('RCPFLOW_PROCESS_ID', "
        "'RCPFLOW_NUM_PROCESSES', 'RCPFLOW_COORDINATOR_ADDRESS', 'XLA_FLAGS', 'JAX_PLATFORMS')})"
        " + chr(10)); sys.stdout.flush(); "
        f"open(os.path.join({str(tmp_path)!r}, str(i)), 'w').close(); "
        "[time.sleep(0.05) for _ in range(1200) "
        f"if i == 1 and len(os.listdir({str(tmp_path)!r})) < 3]; "
        "time.sleep(0 if i == 1 else 60); sys.exit(7 if i == 1 else 0)"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tpu_jobs.launch", "--processes", "3", "--devices-per-process",
         "2", "--grace-s", "1", "--", sys.executable, "-c", script],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 7  # process 1's; the others were killed after the grace period
    seen = sorted(_records(proc.stdout), key=lambda r: r["RCPFLOW_PROCESS_ID"])
    assert [(r["RCPFLOW_PROCESS_ID"], r["RCPFLOW_NUM_PROCESSES"]) for r in seen] == [
        ("0", "3"), ("1", "3"), ("2", "3"),
    ]  # fmt: skip
    [address] = {r["RCPFLOW_COORDINATOR_ADDRESS"] for r in seen}
    assert address.startswith("127.0.0.1:")
    for r in seen:
        assert "--xla_force_host_platform_device_count=2" in r["XLA_FLAGS"].split()
        assert r["JAX_PLATFORMS"] == "cpu"
