"""`CheckpointTrigger`: wait on the triggerer for one planned checkpoint of a training run.

Evaluation during training maps over the planned steps before any exists; each instance defers
to this trigger, which holds no worker slot. It reads the run's files through
`rcpflow.training_progress` (the same answer on local folders and ``gs://``) and, so that a
failed or not yet started training does not leave it waiting until its timeout, the states of
the run's ``train`` task group through the Task SDK. Storage calls are synchronous, so they run
in a thread, off the triggerer's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

from airflow.triggers.base import BaseTrigger, TriggerEvent

from rcpflow.training_progress import ProgressError, checkpoint_progress

TrainingState = Literal["not_started", "running", "succeeded", "failed"]
# A task in one of these states will not run (again) in this DAG run.
_FAILED = frozenset({"failed", "upstream_failed", "skipped", "removed"})
_NOT_STARTED = frozenset({None, "none", "scheduled"})


def training_state(states: Mapping[str, Any]) -> TrainingState:
    """The train group's progress from its tasks' states (task id -> state or None)."""
    values = [None if s is None else str(s) for s in states.values()]
    if any(s in _FAILED for s in values):
        return "failed"
    if values and all(s == "success" for s in values):
        return "succeeded"
    if all(s in _NOT_STARTED for s in values):
        return "not_started"
    return "running"


class CheckpointTrigger(BaseTrigger):
    """Poll every `poll_interval_s` until the checkpoint of `step` is committed or will never
    be. One event ``{"state", "step", "detail"}``, state one of: ``committed``, ``ended``
    (training ended without that row), ``training_failed``, ``not_started`` (the train group
    had not started for `start_grace_s`: the task gives its place back and comes again),
    ``error`` (the run's files are unreadable)."""

    def __init__(
        self,
        *,
        run_dir: str,
        step: int,
        seed: int,
        dag_id: str,
        run_id: str,
        train_group_id: str,
        poll_interval_s: float,
        start_grace_s: float,
    ) -> None:
        super().__init__()
        self.run_dir = run_dir
        self.step = step
        self.seed = seed
        self.dag_id = dag_id
        self.run_id = run_id
        self.train_group_id = train_group_id
        self.poll_interval_s = poll_interval_s
        self.start_grace_s = start_grace_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "run_dir": self.run_dir,
                "step": self.step,
                "seed": self.seed,
                "dag_id": self.dag_id,
                "run_id": self.run_id,
                "train_group_id": self.train_group_id,
                "poll_interval_s": self.poll_interval_s,
                "start_grace_s": self.start_grace_s,
            },
        )

    def _event(self, state: str, detail: str) -> TriggerEvent:
        return TriggerEvent({"state": state, "step": self.step, "detail": detail})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        not_started_since: float | None = None
        while True:
            try:
                progress = await asyncio.to_thread(
                    checkpoint_progress, self.run_dir, self.step, self.seed
                )
            except ProgressError as exc:
                yield self._event("error", str(exc))
                return
            if progress.state != "pending":
                yield self._event(progress.state, progress.detail)
                return
            states = await self.train_task_states()
            if not states:
                yield self._event(
                    "error", f"no tasks of group {self.train_group_id!r} in run {self.run_id}"
                )
                return
            training = training_state(states)
            if training == "failed":
                yield self._event("training_failed", f"the {self.train_group_id} group failed")
                return
            if training == "succeeded":
                # Its output check passed after the job ended: read the files once more, as
                # the last row and block_stop were written before that.
                progress = await asyncio.to_thread(
                    checkpoint_progress, self.run_dir, self.step, self.seed
                )
                detail = (
                    progress.detail
                    if progress.state != "pending"
                    else f"training finished without a checkpoint of step {self.step}"
                )
                state = progress.state if progress.state != "pending" else "ended"
                yield self._event(state, detail)
                return
            if training == "not_started":
                now = time.monotonic()
                not_started_since = not_started_since or now
                if now - not_started_since >= self.start_grace_s:
                    yield self._event(
                        "not_started", f"the {self.train_group_id} group has not started"
                    )
                    return
            else:
                not_started_since = None
            await asyncio.sleep(self.poll_interval_s)

    async def train_task_states(self) -> Mapping[str, Any]:
        """Task id -> state of the tasks of the train group in this DAG run."""
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
        from asgiref.sync import sync_to_async

        # as the standard provider's WorkflowTrigger asks: through the supervisor's comms
        found = await sync_to_async(RuntimeTaskInstance.get_task_states)(
            dag_id=self.dag_id,
            task_group_id=self.train_group_id,
            run_ids=[self.run_id],
        )
        return dict(found.get(self.run_id, {}))
