"""The storage contract, run against a local folder and against the GCS emulator alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from rcpflow.files.layout import join
from rcpflow.files.storage import GCSStorage, LocalStorage, storage_for

SUBPROCESS_TIMEOUT_S = 120


@pytest.fixture(params=["local", pytest.param("gcs", marks=pytest.mark.gcs)])
def root(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh, empty folder: a local directory or a ``gs://`` prefix on the emulator."""
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("gcs_prefix")


def upsert_row(old: bytes | None, row: dict) -> bytes:
    """JSONL keyed by ``step``, sorted by step: the shape of the manifest."""
    rows = {}
    if old:
        for line in old.decode().splitlines():
            r = json.loads(line)
            rows[r["step"]] = r
    rows[row["step"]] = row
    return "".join(json.dumps(rows[k], sort_keys=True) + "\n" for k in sorted(rows)).encode()


def steps_in(data: bytes) -> list[int]:
    return [json.loads(line)["step"] for line in data.decode().splitlines()]


def test_storage_for_picks_backend_by_scheme(tmp_path) -> None:
    assert isinstance(storage_for(str(tmp_path)), LocalStorage)
    assert isinstance(storage_for("gs://bucket/prefix/x"), GCSStorage)


def test_write_read_exists(root: str) -> None:
    s = storage_for(root)
    path = join(root, "mllog", "seed_1.out")
    assert not s.exists(path)
    s.write_atomic(path, "ünïcode line\n".encode())
    assert s.exists(path)
    assert s.read_bytes(path) == "ünïcode line\n".encode()
    assert s.read_text(path) == "ünïcode line\n"
    s.write_atomic(path, b"replaced")
    assert s.read_bytes(path) == b"replaced"


def test_read_missing_raises_file_not_found(root: str) -> None:
    with pytest.raises(FileNotFoundError):
        storage_for(root).read_bytes(join(root, "absent.json"))


def test_list_is_recursive_sorted_full_paths_and_stays_under_the_folder(root: str) -> None:
    s = storage_for(root)
    inside = [join(root, "run", "b.txt"), join(root, "run", "a", "c.txt"), join(root, "run", "z")]
    for p in inside:
        s.write_atomic(p, b"x")
    # A sibling whose name merely starts with the same characters is not "under" run/.
    s.write_atomic(join(root, "run2", "other.txt"), b"x")
    assert s.list(join(root, "run")) == sorted(inside)
    assert s.list(join(root, "run") + "/") == sorted(inside)
    assert s.list(join(root, "nothing-here")) == []


def test_list_does_not_show_lock_or_temp_files(root: str) -> None:
    s = storage_for(root)
    path = join(root, "mllog", "eval_checkpoints.jsonl")
    s.update(path, lambda old: upsert_row(old, {"step": 1}))
    s.write_atomic(join(root, "mllog", "seed_0.out"), b"log")
    assert s.list(join(root, "mllog")) == sorted([path, join(root, "mllog", "seed_0.out")])


def test_delete(root: str) -> None:
    s = storage_for(root)
    path = join(root, "x.json")
    s.write_atomic(path, b"{}")
    s.delete(path)
    assert not s.exists(path)
    s.delete(path)  # deleting what is not there is not an error


def test_update_creates_then_modifies(root: str) -> None:
    s = storage_for(root)
    path = join(root, "m.jsonl")
    seen: list[bytes | None] = []

    def add(step: int):
        def fn(old: bytes | None) -> bytes:
            seen.append(old)
            return upsert_row(old, {"step": step})

        return fn

    assert s.update(path, add(20)) == b'{"step": 20}\n'
    s.update(path, add(18))
    assert seen == [None, b'{"step": 20}\n']
    assert steps_in(s.read_bytes(path)) == [18, 20]


def test_update_error_in_fn_leaves_file_untouched(root: str) -> None:
    s = storage_for(root)
    path = join(root, "m.jsonl")
    s.write_atomic(path, b'{"step": 1}\n')

    def boom(old: bytes | None) -> bytes:
        raise ValueError("bad row")

    with pytest.raises(ValueError, match="bad row"):
        s.update(path, boom)
    assert s.read_bytes(path) == b'{"step": 1}\n'


def test_concurrent_updates_from_threads_lose_nothing(root: str) -> None:
    s = storage_for(root)
    path = join(root, "mllog", "eval_checkpoints.jsonl")
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(offset: int) -> None:
        try:
            start.wait()
            for i in range(50):

                def fn(old: bytes | None, step: int = offset + 2 * i) -> bytes:
                    new = upsert_row(old, {"step": step, "writer": offset})
                    time.sleep(0.001)  # widen the read-modify-write window
                    return new

                s.update(path, fn)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=SUBPROCESS_TIMEOUT_S)
    assert not errors
    assert steps_in(s.read_bytes(path)) == list(range(100))


# A child process that upserts 50 rows once the parent says go (so both really overlap).
_WRITER = """
import json, os, sys, time
from rcpflow.files.storage import storage_for

path, offset, ready, go = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
calls = 0
def upsert(old, step):
    global calls
    calls += 1
    rows = {}
    for line in (old or b"").decode().splitlines():
        r = json.loads(line)
        rows[r["step"]] = r
    rows[step] = {"step": step, "writer": offset}
    return "".join(json.dumps(rows[k], sort_keys=True) + "\\n" for k in sorted(rows)).encode()
s = storage_for(path)
for i in range(50):
    s.update(path, lambda old, step=offset + 2 * i: upsert(old, step))
print(json.dumps({"calls": calls}))
"""


# The same, through the manifest's own upsert (what the trainer and a resumed trainer call).
_MANIFEST_WRITER = """
import os, sys, time
from rcpflow.records.manifest import ManifestRow, upsert

path, offset, ready, go = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
for i in range(50):
    step = 18 + offset + 2 * i
    upsert(path, ManifestRow(
        step=step, checkpoint_path=f"../checkpoints/{step}",
        timestamp_ms=1_700_000_000_000 + 1_000 * step,
        samples_count=256 * step, global_batch_size=256, batch_size=16, num_generations=16,
        val_start_at=18, max_steps=200, target_accuracy=0.69, seed=1, mllog_file="seed_1.out",
    ))
print("{}")
"""


def run_two_writers(script: str, path: str, tmp_path) -> list[str]:
    """Start two writer processes, release them at once, return their last stdout lines."""
    go = tmp_path / "go"
    procs = []
    for k in (0, 1):
        ready = tmp_path / f"ready_{k}"
        cmd = [sys.executable, "-c", script, path, str(k), str(ready), str(go)]
        procs.append((ready, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
        while not all(r.exists() for r, _ in procs):
            assert time.monotonic() < deadline, "writer processes did not start"
            assert all(p.poll() is None for _, p in procs), [p.stderr.read() for _, p in procs]
            time.sleep(0.01)
        go.touch()
        lines = []
        for _, p in procs:
            out, err = p.communicate(timeout=SUBPROCESS_TIMEOUT_S)
            assert p.returncode == 0, err.decode()
            lines.append(out.decode().splitlines()[-1])
        return lines
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S + 30)
def test_concurrent_updates_from_processes_lose_nothing(root: str, tmp_path) -> None:
    path = join(root, "mllog", "eval_checkpoints.jsonl")
    calls = [json.loads(line)["calls"] for line in run_two_writers(_WRITER, path, tmp_path)]
    assert steps_in(storage_for(path).read_bytes(path)) == list(range(100))
    print(f"update fn calls per writer (50 = no conflict): {calls}")


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S + 30)
def test_concurrent_manifest_upserts_from_processes_lose_nothing(root: str, tmp_path) -> None:
    from rcpflow.records.manifest import parse_rows

    path = join(root, "mllog", "eval_checkpoints.jsonl")
    run_two_writers(_MANIFEST_WRITER, path, tmp_path)
    rows = parse_rows(storage_for(path).read_text(path), path)
    assert [r.step for r in rows] == list(range(18, 118))
    assert all(r.samples_count == 256 * r.step for r in rows)


def test_local_write_atomic_failure_keeps_old_file_and_leaves_no_temp(tmp_path) -> None:
    s = LocalStorage()
    path = str(tmp_path / "summary.json")
    s.write_atomic(path, b"old")
    with pytest.raises(TypeError):
        s.write_atomic(path, "not bytes")  # type: ignore[arg-type]
    assert s.read_bytes(path) == b"old"
    assert os.listdir(tmp_path) == ["summary.json"]
