"""`rcpflow manifest add`: the check and the upsert are one step under the manifest's lock, so
concurrent adds never lose a row (threads, processes, and on GCS); a relative --checkpoint is
the user's (current directory) and recorded so that it resolves."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rcpflow_cli import cli_env, run_cli

from devtools.synthetic_run import rows_of
from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.records.manifest import load, read_rows
from rcpflow.trainer.manifest_add import add_row
from rcpflow.trainer.recorder import RecorderError, TrainingRecorder

T0 = 1_700_000_000_000
OWNER = "foreign-trainer"


def started_run(run_dir: str) -> None:
    """A foreign trainer's MLLOG (its writer is this recorder), no rows yet."""
    hp = recipe.hyperparameters("closed", 256, 60)
    rec = TrainingRecorder(run_dir, seed=1, hyperparameters=hp, val_start_at=18, owner=OWNER)
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)


def checkpoint(run_dir: str, step: int) -> str:
    if run_dir.startswith("gs://"):
        path = f"{run_dir}/checkpoints/{step}/w"
        storage_for(path).write_atomic(path, b"w")
        return path.rsplit("/", 1)[0]
    path = Path(run_dir) / "checkpoints" / str(step)
    path.mkdir(parents=True, exist_ok=True)
    (path / "w").write_bytes(b"w")
    return str(path)


def race(run_dir: str, jobs: list[tuple[int, int]]) -> list[tuple[int, int, bool | str]]:
    """Run every (step, timestamp) add at once from threads; what each one answered."""
    barrier = threading.Barrier(len(jobs))
    out: list[tuple[int, int, bool | str]] = []

    def add(step: int, ts: int) -> None:
        ck = checkpoint(run_dir, step)
        barrier.wait()
        try:
            _, added = add_row(run_dir, step, ck, ts, owner=OWNER)
            out.append((step, ts, added))
        except RecorderError as e:
            out.append((step, ts, str(e)))

    threads = [threading.Thread(target=add, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_thirty_concurrent_adds_of_one_step_never_lose_a_row(tmp_path, where, request):
    run_dir = (
        f"{request.getfixturevalue('gcs_prefix')}/run" if where == "gcs" else str(tmp_path / "r")
    )
    started_run(run_dir)
    out = race(run_dir, [(18, T0 + 78_000 + i) for i in range(30)])
    added = [o for o in out if o[2] is True]
    assert len(added) == 1, out  # one wins; each other one is refused naming the winner
    assert all("step 18: already recorded" in str(o[2]) for o in out if o[2] is not True)
    assert [(r.step, r.timestamp_ms) for r in rows_of(run_dir)] == [(18, added[0][1])]


def test_concurrent_adds_of_different_steps_never_lose_a_row(tmp_path):
    run_dir = str(tmp_path / "run")
    started_run(run_dir)
    pending = list(range(18, 48))
    rounds = 0
    while pending:  # each round every pending step tries at once; only the next one fits
        rounds += 1
        random.shuffle(pending)
        out = race(run_dir, [(s, T0 + 60_000 + s * 1_000) for s in pending])
        won = {o[0] for o in out if o[2] is True}
        assert all(o[2] is True or "first" in str(o[2]) or "next" in str(o[2]) for o in out)
        pending = [s for s in pending if s not in won]
    rows = rows_of(run_dir)
    assert [r.step for r in rows] == list(range(18, 48))


def test_concurrent_adds_from_processes_never_lose_a_row(tmp_path):
    run_dir = str(tmp_path / "run")
    started_run(run_dir)
    ck = checkpoint(run_dir, 18)
    procs = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "rcpflow", "manifest", "add", run_dir, "--step", "18"),
                *("--checkpoint", ck, "--timestamp-ms", str(T0 + 78_000 + i), "--owner", OWNER),
            ],
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(12)
    ]
    answers = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]
    ok = [a for a in answers if a[0] == 0]
    assert len(ok) == 1, answers
    assert all("already recorded" in a[2] for a in answers if a[0] != 0)
    (row,) = rows_of(run_dir)
    assert f"at {row.timestamp_ms}" in ok[0][1]


def test_a_relative_checkpoint_is_resolved_against_the_current_directory(tmp_path):
    run_dir = str(tmp_path / "run")
    started_run(run_dir)
    checkpoint(run_dir, 18)
    elsewhere = tmp_path / "outside"
    (elsewhere / "ck19").mkdir(parents=True)
    (elsewhere / "ck19" / "w").write_bytes(b"w")
    # from inside the run folder, and from another folder
    p = run_cli(
        "manifest", "add", "run", "--step", "18", "--checkpoint", "run/checkpoints/18",
        "--timestamp-ms", str(T0 + 78_000), "--owner", OWNER, cwd=str(tmp_path),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    p = run_cli(
        "manifest", "add", run_dir, "--step", "19", "--checkpoint", "ck19",
        "--timestamp-ms", str(T0 + 79_000), "--owner", OWNER, cwd=str(elsewhere),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    raw = [r.checkpoint_path for r in read_rows(RunLayout(run_dir).manifest)]
    assert raw == ["../checkpoints/18", str(elsewhere / "ck19")]
    resolved = load(RunLayout(run_dir).manifest).rows
    assert all(os.path.isdir(r.checkpoint_path) for r in resolved)
    p = run_cli(
        "manifest", "add", run_dir, "--step", "20", "--checkpoint", "nowhere",
        "--timestamp-ms", str(T0 + 80_000), "--owner", OWNER, cwd=str(elsewhere),
    )  # fmt: skip
    assert p.returncode == 1 and f"no checkpoint at {elsewhere / 'nowhere'}" in p.stderr
