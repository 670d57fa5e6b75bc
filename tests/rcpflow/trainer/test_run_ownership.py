"""A run folder has one owner at a time (the lease `owner.json`), and a finished run's MLLOG is
never started afresh by a trainer (`rcpflow run reset` moves it aside first)."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lease_runs import MAX_STEPS, T0, VAL_START, checkpoint, recorder
from rcpflow_cli import cli_env, run_cli

from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import StorageError, storage_for
from rcpflow.files.usererrors import describe
from rcpflow.trainer import ownership
from rcpflow.trainer.recorder import RunFolderError, TrainingRecorder


def train_to_the_end(rec: TrainingRecorder, run_dir: str) -> None:
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    for step in range(1, MAX_STEPS + 1):
        rec.on_update(step, timestamp_ms=T0 + 60_000 + step * 1_000)
        if step >= VAL_START:
            rec.on_checkpoint_committed(step, checkpoint(run_dir, step))
    rec.on_train_end()


def lease(run_dir: str) -> dict:
    return json.loads(Path(ownership.lease_path(run_dir)).read_text())


def foreign_lease(run_dir: str, *, host: str, heartbeat_ms: int, owner: str | None = None) -> None:
    holder = ownership.Holder(host, 4242, "f" * 16, owner, heartbeat_ms, heartbeat_ms)
    Path(ownership.lease_path(run_dir)).parent.mkdir(parents=True, exist_ok=True)
    Path(ownership.lease_path(run_dir)).write_bytes(holder.to_json())


# A trainer in another process that takes the folder and holds it until told to go.
HOLDER = """
import sys, time
from pathlib import Path
from rcpflow import recipe
from rcpflow.trainer.recorder import TrainingRecorder
hp = recipe.hyperparameters("closed", 256, 20)
rec = TrainingRecorder(sys.argv[1], seed=1, hyperparameters=hp, val_start_at=18, owner=sys.argv[2])
rec.on_init_start()
Path(sys.argv[3]).write_text("ready")
while not Path(sys.argv[4]).exists():
    time.sleep(0.02)
"""


def test_a_second_trainer_in_another_process_is_refused_naming_the_owner(tmp_path):
    run_dir = str(tmp_path / "run")
    ready, go = tmp_path / "ready", tmp_path / "go"
    first = subprocess.Popen(
        [sys.executable, "-c", HOLDER, run_dir, "dagrun-1/train", str(ready), str(go)],
        env=cli_env(),
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), "the first trainer did not start"
        log_before = Path(RunLayout(run_dir).mllog(1)).read_bytes()
        second = recorder(run_dir, owner="dagrun-2/train")
        with pytest.raises(RunFolderError, match=r"owned by dagrun-1/train \(host ") as e:
            second.on_init_start(T0)
        assert "a second trainer is refused" in str(e.value) and "\n" not in str(e.value)
        assert Path(RunLayout(run_dir).mllog(1)).read_bytes() == log_before  # untouched
        # the jobs print StorageErrors as one line, exit 1 (tpu_jobs/job_errors.py)
        assert isinstance(e.value, StorageError) and describe(e.value) == str(e.value)
        # a retry of the same DAG run's task is the owner
        retry = recorder(run_dir, owner="dagrun-1/train")
        retry.on_init_start(T0)
        assert lease(run_dir)["owner"] == "dagrun-1/train"
        assert lease(run_dir)["pid"] != first.pid
    finally:
        go.write_text("go")
        first.wait(timeout=60)


def test_the_jobs_report_a_refused_trainer_in_one_line_with_exit_1(tmp_path, capsys):
    from tpu_jobs.rcp import job_errors

    run_dir = str(tmp_path / "run")
    foreign_lease(run_dir, host="pod-a", heartbeat_ms=ownership.now_ms(), owner="dag-a")
    with pytest.raises(RunFolderError) as e:
        recorder(run_dir, owner="dag-b").on_init_start(T0)
    assert isinstance(e.value, job_errors.USER_ERRORS)
    assert job_errors.report("train", e.value) == 5  # invalid input: fails at once
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train: error: ") and "dag-a" in err


def test_a_stale_lease_is_taken_over_saying_so(tmp_path, caplog):
    run_dir = str(tmp_path / "run")
    foreign_lease(run_dir, host="pod-gone", heartbeat_ms=ownership.now_ms() - 11 * 60_000)
    with caplog.at_level(logging.WARNING):
        recorder(run_dir, owner="dag-b").on_init_start(T0)
    assert lease(run_dir)["owner"] == "dag-b"
    assert any("took over the lease of (host pod-gone" in r.getMessage() for r in caplog.records)
    # the timeout is settable: a 10-minute-old heartbeat holds with a 1-hour timeout
    run2 = str(tmp_path / "run2")
    foreign_lease(run2, host="pod-a", heartbeat_ms=ownership.now_ms() - 11 * 60_000)
    with pytest.raises(RunFolderError, match="owned by"):
        recorder(run2, owner="dag-b", lease_timeout_s=3600).on_init_start(T0)


def test_a_lease_left_by_a_dead_process_on_this_host_is_free(tmp_path):
    run_dir = str(tmp_path / "run")
    # a trainer killed without cleaning up (os._exit skips the release at exit)
    code = HOLDER.replace("while not", "import os; os._exit(0)\nwhile not")
    subprocess.run(
        [sys.executable, "-c", code, run_dir, "x", str(tmp_path / "r"), str(tmp_path / "g")],
        env=cli_env(),
        check=True,
    )
    assert Path(ownership.lease_path(run_dir)).exists()
    rec = recorder(run_dir, owner="other")
    rec.on_init_start(T0)
    assert lease(run_dir)["owner"] == "other"


def test_the_lease_is_released_at_the_end_of_training(tmp_path):
    run_dir = str(tmp_path / "run")
    train_to_the_end(recorder(run_dir, owner="a"), run_dir)
    assert not Path(ownership.lease_path(run_dir)).exists()  # a finished folder holds no lease
    # another owner may now use the folder (and is refused only because the run has ended)
    with pytest.raises(RunFolderError, match="the run has ended"):
        recorder(run_dir, owner="b").on_init_start(T0)


def test_the_heartbeat_keeps_a_long_step_owned(tmp_path):
    run_dir = str(tmp_path / "run")
    rec = recorder(run_dir, owner="a", lease_timeout_s=2.0)  # a heartbeat every 0.4 s
    rec.on_init_start(T0)
    first = lease(run_dir)["heartbeat_ms"]
    time.sleep(3.0)  # a long compile: no recorder call at all
    assert lease(run_dir)["heartbeat_ms"] > first
    with pytest.raises(RunFolderError, match="owned by a "):
        recorder(run_dir, owner="b", lease_timeout_s=2.0).on_init_start(T0)


def test_a_trainer_whose_lease_was_taken_stops_at_its_next_update(tmp_path):
    run_dir = str(tmp_path / "run")
    rec = recorder(run_dir, owner="a")
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    foreign_lease(run_dir, host="pod-b", heartbeat_ms=ownership.now_ms(), owner="b")
    rec._lease.refresh()  # what the heartbeat thread does
    with pytest.raises(RunFolderError, match=r"lost the run folder: .* held by b"):
        rec.on_update(1, timestamp_ms=T0 + 61_000)
    rec._lease.release()
    assert lease(run_dir)["owner"] == "b"  # another's lease is never released by us


def test_ownership_on_gcs(gcs_prefix):
    run_dir = f"{gcs_prefix}/run"
    first = recorder(run_dir, owner="dag-a")
    first.on_init_start(T0)
    with pytest.raises(RunFolderError, match="owned by dag-a"):
        recorder(run_dir, owner="dag-b").on_init_start(T0)
    first._lease.release()
    recorder(run_dir, owner="dag-b").on_init_start(T0)
    path = ownership.lease_path(run_dir)
    assert json.loads(storage_for(path).read_bytes(path))["owner"] == "dag-b"


def test_a_finished_runs_log_is_never_rewritten_by_a_trainer(tmp_path):
    run_dir = str(tmp_path / "run")
    train_to_the_end(recorder(run_dir, owner="a"), run_dir)
    log_path = Path(RunLayout(run_dir).mllog(1))
    before = log_path.read_bytes()
    shutil.rmtree(Path(run_dir) / "checkpoints")  # every checkpoint folder deleted
    again = recorder(run_dir, owner="a")
    assert again.resume() is not None  # the log and rows are still there: resumed, finished
    fresh = recorder(run_dir, owner="a")  # a trainer that saw no checkpoint starts afresh
    with pytest.raises(RunFolderError, match=r"block_stop at line \d+.*rcpflow run reset"):
        fresh.on_init_start(T0 + 1)
    assert log_path.read_bytes() == before
    for rec in (again, fresh):  # what their processes do at exit
        rec._lease.release()

    p = run_cli("run", "reset", run_dir)
    assert p.returncode == 0, p.stderr
    moved = sorted(str(x.relative_to(run_dir)) for x in Path(run_dir, "previous").rglob("*.*"))
    assert [m.split("/", 2)[2] for m in moved] == [
        "mllog/eval_checkpoints.jsonl",
        "mllog/seed_1.out",
    ]
    assert next(Path(run_dir, "previous").rglob("seed_1.out")).read_bytes() == before
    assert not log_path.exists()
    recorder(run_dir, owner="a").on_init_start(T0 + 1)  # now it may start afresh
    assert log_path.exists()
    (tmp_path / "empty").mkdir()
    p = run_cli("run", "reset", str(tmp_path / "empty"))
    assert p.returncode == 1 and "no MLLOG or manifest" in p.stderr


def test_run_reset_is_refused_while_a_trainer_owns_the_folder(tmp_path):
    run_dir = str(tmp_path / "run")
    recorder(run_dir, owner="live").on_init_start(T0)
    p = run_cli("run", "reset", run_dir)
    assert p.returncode == 1 and "owned by live" in p.stderr
    assert Path(RunLayout(run_dir).mllog(1)).exists()


def test_manifest_add_into_a_folder_another_trainer_owns_is_refused(tmp_path):
    run_dir = str(tmp_path / "run")
    rec = recorder(run_dir, owner="python-trainer")
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    args = ["manifest", "add", run_dir, "--step", "18", "--checkpoint"]
    args += [checkpoint(run_dir, 18), "--timestamp-ms", str(T0 + 78_000)]
    p = run_cli(*args)
    assert p.returncode == 1 and "owned by python-trainer" in p.stderr
    p = run_cli(*args, env=cli_env(RCPFLOW_RUN_OWNER="someone-else"))
    assert p.returncode == 1 and "owned by python-trainer" in p.stderr
    assert not Path(RunLayout(run_dir).manifest).exists()
    p = run_cli(*args, "--owner", "python-trainer")
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", "inf", "1e9"])
def test_a_bad_lease_timeout_is_one_line_in_the_jobs_and_the_cli(
    tmp_path, capsys, monkeypatch, value
):
    from tpu_jobs.rcp import job_errors

    run_dir = str(tmp_path / "run")
    rec = recorder(run_dir, owner="dag-a")
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    monkeypatch.setenv(ownership.TIMEOUT_ENV, value)
    with pytest.raises(ownership.LeaseTimeoutError) as e:
        recorder(run_dir, owner="dag-a")
    assert isinstance(e.value, StorageError) and isinstance(e.value, job_errors.USER_ERRORS)
    assert job_errors.report("train", e.value) == 5  # a setting: the same on every restart
    err = capsys.readouterr().err
    assert (
        err
        == f"train: error: {ownership.TIMEOUT_ENV}={value!r}: not a number of seconds in (0, 1e7)\n"
    )
    args = ["manifest", "add", run_dir, "--step", "18", "--checkpoint", checkpoint(run_dir, 18)]
    args += ["--timestamp-ms", str(T0 + 78_000), "--owner", "dag-a"]
    p = run_cli(*args, env=cli_env(**{ownership.TIMEOUT_ENV: value}))
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert f"{ownership.TIMEOUT_ENV}={value!r}" in p.stderr and "Traceback" not in p.stderr


def test_an_airflow_tasks_identity_is_the_same_for_every_try(monkeypatch):
    monkeypatch.delenv(ownership.OWNER_ENV, raising=False)
    for name, value in zip(
        ownership._AIRFLOW_ENV, ("d", "manual__1", "train.job.run"), strict=True
    ):
        monkeypatch.setenv(name, value)
    assert ownership.owner_from_env() == ownership.airflow_owner("d", "manual__1", "train.job.run")
    assert ownership.owner_from_env() == "airflow:d/manual__1/train.job.run"
    monkeypatch.setenv(ownership.OWNER_ENV, "given")
    assert ownership.owner_from_env() == "given"
