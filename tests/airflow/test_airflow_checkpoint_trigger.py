"""The checkpoint trigger's decisions, on real run folders: committed, ended, training failed,
not started (then the task gives its place back), unreadable files. The train group's task
states come from a list here instead of the metadata DB (the scheduler test covers that path)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from synthetic_run import make_run

from rcpflow.layout import RunLayout
from tasks.run.triggers import CheckpointTrigger, WaitTarget, training_state


class ScriptedTrigger(CheckpointTrigger):
    """The train group's states at each poll come from `script` (the last one repeats)."""

    script: list[Mapping[str, Any]]

    async def train_task_states(self, target: WaitTarget) -> Mapping[str, Any]:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]


def first_event(run_dir: str, step: int, script: list[Mapping[str, Any]]) -> dict[str, Any]:
    trigger = ScriptedTrigger(
        run_dir=run_dir, step=step, seed=1, dag_id="d", run_id="r", train_group_id="train",
        poll_interval_s=0.01, start_grace_s=0.05,
    )  # fmt: skip
    trigger.script = script
    _, kwargs = trigger.serialize()  # what the triggerer rebuilds it from
    assert CheckpointTrigger(**kwargs).serialize() == (
        "tasks.run.triggers.CheckpointTrigger",
        kwargs,
    )

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    return asyncio.run(asyncio.wait_for(first(), timeout=30))


RUNNING = {"train.train_job": "running", "train.check_outputs": None}


@pytest.mark.parametrize(
    ("states", "want"),
    [
        ({"a": None, "b": None}, "not_started"),
        ({"a": "scheduled", "b": None}, "not_started"),
        ({"a": "queued", "b": None}, "running"),
        ({"a": "up_for_retry", "b": None}, "running"),
        ({"a": "success", "b": "running"}, "running"),
        ({"a": "success", "b": "success"}, "succeeded"),
        ({"a": "failed", "b": "upstream_failed"}, "failed"),
    ],
)
def test_training_state(states: dict[str, Any], want: str) -> None:
    assert training_state(states) == want


def test_committed_and_ended(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=24, last_step=20)  # stopped at step 20
    assert first_event(run.run_dir, 19, [RUNNING])["state"] == "committed"
    ended = first_event(run.run_dir, 21, [RUNNING])
    assert ended["state"] == "ended" and "block_stop at step 20" in ended["detail"]


def test_waits_while_training_runs_then_sees_the_row(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    # no files yet and training running: it keeps polling; once the group has succeeded
    # without any row it reports the end
    done = {"train.train_job": "success", "train.check_outputs": "success"}
    event = first_event(run_dir, 18, [RUNNING, RUNNING, RUNNING, done])
    assert event["state"] == "ended"
    assert "training finished without a checkpoint of step 18" in event["detail"]


def test_failed_and_not_started_training(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    failed = {"train.train_job": "failed", "train.check_outputs": "upstream_failed"}
    assert first_event(run_dir, 18, [failed])["state"] == "training_failed"
    idle = {"train.train_job": "scheduled", "train.check_outputs": None}
    assert first_event(run_dir, 18, [idle])["state"] == "not_started"
    assert first_event(run_dir, 18, [{}])["state"] == "error"  # no such group


def test_an_unreadable_manifest_is_an_error(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=24, last_step=20)
    Path(RunLayout(run.run_dir).manifest).write_text("{broken\n")
    event = first_event(run.run_dir, 19, [RUNNING])
    assert event["state"] == "error" and "manifest" in event["detail"]
