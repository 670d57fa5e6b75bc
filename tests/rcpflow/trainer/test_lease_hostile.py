"""The run-folder lease against a hostile folder (issue 29): a lease or lock that is a symlink
or not a regular file is refused by name and nothing outside the folder is written or removed;
a heartbeat from the future is stale beyond the timeout; an absurd process id is an unreadable
lease, never a traceback; a removed run folder is never recreated; a trainer that lost its lease
writes nothing more."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from lease_runs import T0, VAL_START, checkpoint, recorder

from rcpflow.files.layout import RunLayout
from rcpflow.trainer import ownership
from rcpflow.trainer.recorder import RunFolderError


def write_lease(run_dir: str, **fields: object) -> Path:
    d = {
        "format": ownership.FORMAT, "host": "pod-x", "pid": 4242, "token": "f" * 16,
        "owner": "x", "since_ms": ownership.now_ms(), "heartbeat_ms": ownership.now_ms(),
    }  # fmt: skip
    d.update(fields)
    path = Path(ownership.lease_path(run_dir))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(d))
    return path


def test_a_symlinked_lease_is_refused_and_its_target_untouched(tmp_path):
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, ownership.lease_path(run_dir))
    with pytest.raises(RunFolderError, match=r"owner\.json: the lease is a symlink"):
        recorder(run_dir, owner="a").on_init_start(T0)
    assert victim.read_text() == "precious\n"
    lease = ownership.Lease(run_dir, "a", 600)
    lease.release()  # never removes the target (nor the link) through the link
    assert victim.read_text() == "precious\n"
    assert os.path.islink(ownership.lease_path(run_dir))


def test_a_symlinked_lock_and_a_lease_that_is_a_folder_are_refused_by_name(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, run_dir / ".owner.json.lock")
    with pytest.raises(ownership.LeaseFileError, match=r"\.owner\.json\.lock: the lease's lock"):
        ownership.Lease(str(run_dir), "a", 600).acquire()
    assert victim.read_text() == "precious\n"
    os.unlink(run_dir / ".owner.json.lock")
    (run_dir / "owner.json").mkdir()
    with pytest.raises(ownership.LeaseFileError, match="not a regular file"):
        ownership.Lease(str(run_dir), "a", 600).acquire()


def test_the_lease_is_replaced_atomically_inside_the_folder(tmp_path):
    run_dir = str(tmp_path / "run")
    lease = ownership.Lease(run_dir, "a", 600)
    lease.acquire()
    first = os.stat(ownership.lease_path(run_dir)).st_ino
    lease.refresh()
    assert os.stat(ownership.lease_path(run_dir)).st_ino != first  # a new file, renamed in
    assert sorted(os.listdir(run_dir)) == [".owner.json.lock", "owner.json"]  # no temp left


@pytest.mark.parametrize("ahead_s", [3600, 10**9])
def test_a_heartbeat_from_the_future_is_stale_and_named(tmp_path, caplog, ahead_s):
    run_dir = str(tmp_path / "run")
    future = ownership.now_ms() + ahead_s * 1000
    write_lease(run_dir, heartbeat_ms=future, since_ms=future)
    said = ownership.Lease(run_dir, "b", 600).acquire()
    assert said is not None and "in the future" in said and "x (host pod-x" in said


def test_a_heartbeat_slightly_ahead_still_holds(tmp_path):
    run_dir = str(tmp_path / "run")
    write_lease(run_dir, heartbeat_ms=ownership.now_ms() + 30_000)  # a clock 30 s ahead
    with pytest.raises(ownership.RunOwnedError, match="owned by x"):
        ownership.Lease(run_dir, "b", 600).acquire()


@pytest.mark.parametrize("pid", [2**62, 2**31, -1, 0, 2**63])
def test_an_absurd_pid_on_this_host_is_no_traceback(tmp_path, pid):
    import socket

    run_dir = str(tmp_path / "run")
    write_lease(run_dir, host=socket.gethostname(), pid=pid, owner=None)
    said = ownership.Lease(run_dir, "b", 600).acquire()  # the trainer's path
    assert said is not None and "replaced an unreadable lease" in said
    write_lease(run_dir, host=socket.gethostname(), pid=pid, owner=None)
    ownership.check_or_refresh(RunLayout(run_dir), None)  # run reset's and manifest add's path


def test_release_and_refresh_never_recreate_a_removed_folder(tmp_path):
    run_dir = tmp_path / "run"
    lease = ownership.Lease(str(run_dir), "a", 600)
    lease.acquire()
    shutil.rmtree(run_dir)
    lease.refresh()
    assert not run_dir.exists()
    assert lease.lost is not None and "run folder is gone" in lease.lost
    lease.release()
    ownership._release_at_exit(lease.path, lease.me.token)
    assert not run_dir.exists()


def test_a_trainer_that_lost_its_lease_writes_no_row_and_no_block_stop(tmp_path):
    run_dir = str(tmp_path / "run")
    rec = recorder(run_dir, owner="a")
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    for step in range(1, VAL_START + 1):
        rec.on_update(step, timestamp_ms=T0 + 60_000 + step * 1_000)
    # another owner takes the lease between two heartbeats: the recorder has not seen it yet
    write_lease(run_dir, owner="b")
    log_before = Path(rec.mllog_path).read_bytes()
    with pytest.raises(RunFolderError, match=r"step 18: this trainer lost the run folder.*b"):
        rec.on_checkpoint_committed(VAL_START, checkpoint(run_dir, VAL_START))
    assert not Path(RunLayout(run_dir).manifest).exists()
    with pytest.raises(RunFolderError, match="lost the run folder"):
        rec.on_train_end()
    assert Path(rec.mllog_path).read_bytes() == log_before  # no block_stop
    assert json.loads(Path(ownership.lease_path(run_dir)).read_text())["owner"] == "b"


def test_a_future_heartbeat_on_gcs_is_stale_and_a_removed_lease_is_not_rewritten(gcs_prefix):
    from rcpflow.files.storage import storage_for

    run_dir = f"{gcs_prefix}/run"
    path = ownership.lease_path(run_dir)
    future = ownership.now_ms() + 10**9
    holder = ownership.Holder("pod-x", 4242, "f" * 16, "x", future, future)
    storage_for(path).write_atomic(path, holder.to_json())
    lease = ownership.Lease(run_dir, "b", 600)
    said = lease.acquire()
    assert said is not None and "in the future" in said
    storage_for(path).delete(path)
    lease.refresh()
    assert lease.lost is not None and not storage_for(path).exists(path)
