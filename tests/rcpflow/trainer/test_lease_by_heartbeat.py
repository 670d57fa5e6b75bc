"""A lease for trainers that are not Python (issue 29): `manifest add --owner` and `rcpflow lease
hold|renew|release` keep the lease alive by heartbeat, not by the command's process id, so a
second owner's add and `run reset` are refused while the heartbeat is fresh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lease_runs import T0, checkpoint
from rcpflow_cli import cli_env, run_cli

from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.trainer import ownership
from rcpflow.trainer.manifest_add import add_row
from rcpflow.trainer.recorder import TrainingRecorder
from rcpflow.trainer.run_reset import ResetError, reset_run


def foreign_run(run_dir: str) -> None:
    """A foreign trainer's MLLOG written by a recorder that has since exited (lease released)."""
    hp = recipe.hyperparameters("closed", 256, 60)
    rec = TrainingRecorder(run_dir, seed=1, hyperparameters=hp, val_start_at=18, owner="writer")
    rec.on_init_start(T0)
    rec.on_run_start(T0 + 30_000)
    rec._lease.release()


def test_an_add_with_owner_holds_the_lease_by_heartbeat_not_by_its_pid(tmp_path):
    run_dir = str(tmp_path / "run")
    foreign_run(run_dir)
    p = run_cli(
        "manifest", "add", run_dir, "--step", "18", "--checkpoint", checkpoint(run_dir, 18),
        "--timestamp-ms", str(T0 + 60_000), "--owner", "A",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    held = json.loads(Path(ownership.lease_path(run_dir)).read_text())
    assert held["owner"] == "A" and held["by_heartbeat"] is True
    # the add's process is gone; A's heartbeat is fresh: B is refused, and so is a reset
    with pytest.raises(ownership.RunOwnedError, match=r"owned by A \(host .*held by heartbeat"):
        add_row(run_dir, 19, checkpoint(run_dir, 19), T0 + 61_000, owner="B")
    with pytest.raises(ResetError, match=r"owned by A .*reset is refused while the lease is live"):
        reset_run(run_dir)
    assert Path(RunLayout(run_dir).mllog(1)).exists()


def test_lease_hold_renew_release_from_the_command_line(tmp_path):
    run_dir = str(tmp_path / "run")
    foreign_run(run_dir)
    p = run_cli("lease", "hold", run_dir, "--owner", "A")
    assert (p.returncode, p.stdout.strip()) == (0, "held by A"), p.stderr
    p = run_cli("lease", "hold", run_dir, "--owner", "B")
    assert p.returncode == 1 and p.stderr.startswith("invalid: ") and "owned by A" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    before = json.loads(Path(ownership.lease_path(run_dir)).read_text())["heartbeat_ms"]
    p = run_cli("lease", "renew", run_dir, "--owner", "A")
    assert p.returncode == 0, p.stderr
    assert json.loads(Path(ownership.lease_path(run_dir)).read_text())["heartbeat_ms"] >= before
    p = run_cli("lease", "renew", run_dir, "--owner", "B")
    assert p.returncode == 1 and "held by A" in p.stderr and "not B" in p.stderr
    p = run_cli("run", "reset", run_dir)
    assert p.returncode == 1 and "lease is live" in p.stderr
    p = run_cli("lease", "release", run_dir, "--owner", "B")
    assert p.returncode == 1 and "not released" in p.stderr
    p = run_cli("lease", "release", run_dir, "--owner", "A")
    assert (p.returncode, p.stdout.strip()) == (0, "released by A"), p.stderr
    assert not Path(ownership.lease_path(run_dir)).exists()
    env = {  # no identity: neither RCPFLOW_RUN_OWNER nor an Airflow task's
        k: v
        for k, v in cli_env().items()
        if k != ownership.OWNER_ENV and not k.startswith("AIRFLOW_CTX_")
    }
    p = run_cli("lease", "hold", run_dir, env=env)
    assert p.returncode == 2 and "--owner" in p.stderr


def test_a_stale_heartbeat_lease_is_free(tmp_path):
    run_dir = str(tmp_path / "run")
    ownership.hold(run_dir, "A", 600)
    path = Path(ownership.lease_path(run_dir))
    d = json.loads(path.read_text())
    d["heartbeat_ms"] -= 601_000
    path.write_text(json.dumps(d))
    said = ownership.hold(run_dir, "B", 600)
    assert said is not None and "took over the lease of A" in said
    with pytest.raises(ownership.RunOwnedError, match=r"held by B .*not A"):
        ownership.renew(run_dir, "A")  # A learns it lost the run: it must stop writing
