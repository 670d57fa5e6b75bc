"""How rcpflow replaces files: modes and links kept, two identical concurrent finalizes both
succeed while a different concurrent write fails loudly, and a killed writer leaves no temp file
that matters."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from file_tree import append_bytes
from rcpflow_cli import cli_env, run_cli

from devtools.synthetic_run import passing_run
from rcpflow.files import logtext
from rcpflow.files.storage import LocalStorage
from rcpflow.records.mllog import parse, read_events
from rcpflow.verdict.finalize import finalize


def _mode(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_files_honour_the_umask(tmp_path):
    s = LocalStorage()
    old = os.umask(0o027)
    try:
        s.write_atomic(str(tmp_path / "new.json"), b"{}")
        s.update(str(tmp_path / "new.jsonl"), lambda _: b"{}\n")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "new.json") == 0o640
    assert _mode(tmp_path / "new.jsonl") == 0o640
    os.chmod(tmp_path / "new.json", 0o604)
    s.write_atomic(str(tmp_path / "new.json"), b"[]")  # a replaced file keeps its mode
    assert _mode(tmp_path / "new.json") == 0o604


def test_finalize_keeps_the_log_mode(tmp_path):
    run = passing_run(tmp_path)
    os.chmod(run.log_file, 0o644)
    p = run_cli("finalize", run.run_dir, umask=0o077)
    assert p.returncode == 0, p.stderr
    assert _mode(run.log_file) == 0o644  # not 0o600, whatever the umask: a replaced file's mode


def test_symlinked_log_stays_a_link(tmp_path):
    run = passing_run(tmp_path)
    elsewhere = tmp_path / "logs" / "seed_1.out"
    elsewhere.parent.mkdir()
    shutil.move(run.log_file, elsewhere)
    run.log_file.symlink_to(os.path.relpath(elsewhere, run.log_file.parent))
    assert finalize(run.run_dir).status == "success"
    assert run.log_file.is_symlink()
    assert [e.key for e in read_events(str(elsewhere))].count("run_stop") == 1
    assert sorted(os.listdir(elsewhere.parent)) == [".seed_1.out.lock", "seed_1.out"]


def _blocked_waiters(lock_file: Path) -> int:
    inode = os.stat(lock_file).st_ino
    with open("/proc/locks") as f:
        return sum(1 for ln in f if "->" in ln and ln.split()[6].endswith(f":{inode}"))


def _wait_blocked(lock_file: Path, procs: list[subprocess.Popen], n: int) -> None:
    deadline = time.monotonic() + 120
    while _blocked_waiters(lock_file) < n:
        assert time.monotonic() < deadline, f"{n} finalize(s) should be waiting on the lock"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)


def test_two_identical_concurrent_finalizes_both_exit_0(tmp_path):
    run = passing_run(tmp_path)
    lock_file = run.log_file.parent / f".{run.log_file.name}.lock"
    # Hold the log's lock so that both processes read the log before either writes: the
    # interleaving in which the second used to fail with "changed while finalizing".
    with open(lock_file, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        procs = [
            subprocess.Popen([sys.executable, "-m", "rcpflow", "finalize", run.run_dir],
                             env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
            for _ in range(2)
        ]  # fmt: skip
        _wait_blocked(lock_file, procs, 2)
        fcntl.flock(lock, fcntl.LOCK_UN)
    outcomes = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outcomes
    written = run.log_file.read_bytes()
    assert [e.key for e in parse(logtext.decode(written))].count("run_stop") == 1
    finalize(run.run_dir)
    assert run.log_file.read_bytes() == written


def test_a_different_concurrent_write_still_fails_loudly(tmp_path):
    run = passing_run(tmp_path)
    lock_file = run.log_file.parent / f".{run.log_file.name}.lock"
    with open(lock_file, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.Popen([sys.executable, "-m", "rcpflow", "finalize", run.run_dir],
                                env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        _wait_blocked(lock_file, [proc], 1)
        append_bytes(
            run.log_file, b"late trainer output\n"
        )  # between finalize's read and its write
        with_late_line = run.log_file.read_bytes()
        fcntl.flock(lock, fcntl.LOCK_UN)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "changed while finalizing" in err, err
    assert run.log_file.read_bytes() == with_late_line


KILL_AT_RENAME = (
    "import os, signal, sys\n"
    "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
    "from rcpflow.cli.commands import main\n"
    "sys.exit(main(['finalize', sys.argv[1]]))\n"
)


def test_killed_finalize_leaves_no_temp_file_that_matters(tmp_path):
    """SIGKILL between writing the new log and renaming it over the old one: the log is as it
    was, the temp file is a dot file no listing shows, and the next write of the log removes it
    (its writer's process is gone)."""
    run = passing_run(tmp_path)
    before = run.log_file.read_bytes()
    p = subprocess.run(
        [sys.executable, "-c", KILL_AT_RENAME, run.run_dir], env=cli_env(), timeout=120
    )
    assert p.returncode == -signal.SIGKILL
    assert run.log_file.read_bytes() == before
    temps = [f for f in os.listdir(run.log_file.parent) if f.endswith(".tmp")]
    assert len(temps) == 1 and temps[0].startswith(".seed_1.out.")
    assert LocalStorage().list(run.layout.mllog_dir) == sorted(
        [str(run.log_file), run.layout.manifest]
    )
    assert run_cli("finalize", run.run_dir).returncode == 0
    assert [f for f in os.listdir(run.log_file.parent) if f.endswith(".tmp")] == []


def test_live_or_foreign_temp_files_are_left_alone(tmp_path):
    from rcpflow.files.storage import _HOST

    target = tmp_path / "x.json"
    ours = tmp_path / f".x.json.{_HOST}.{os.getpid()}.abcd1234.tmp"  # a live writer (us)
    foreign = tmp_path / ".x.json.another-host.1.abcd1234.tmp"  # can't tell: keep
    for f in (ours, foreign):
        f.write_bytes(b"")
    LocalStorage().write_atomic(str(target), b"{}")
    assert ours.exists() and foreign.exists()
