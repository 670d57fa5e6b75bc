"""Triggers that wait on the triggerer for one planned checkpoint of a training run.

Evaluation during training maps over the planned steps before any exists; each step's ``wait``
waits here, holding no worker slot. Two ways in:

- `StartedCheckpointTrigger`: the wait starts on the triggerer (``start_from_trigger``) and
  ends there: it finds its step and run from the DAG run's XComs, and ends the task itself
  (success with the row as its XCom, or skipped), so a waiting step costs no worker process at
  all: dozens of planned steps would otherwise each start one while training runs;
- `CheckpointTrigger`: a wait that started on a worker (``dag.test()``, which runs tasks one
  at a time) defers to it and resumes with its event.

Both read the run's files through `rcpflow.training_progress` (the same answer on local folders
and ``gs://``) and, so that a failed or not yet started training does not leave them waiting
until their timeout, the states of the run's ``train`` task group through the Task SDK. The
waits of one run share those reads (`SharedReads`): one per poll for all its steps. Storage
calls are synchronous, so they run in a thread, off the triggerer's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from airflow.triggers.base import (
    BaseTrigger,
    TaskFailedEvent,
    TaskSkippedEvent,
    TaskSuccessEvent,
    TriggerEvent,
)

from rcpflow.checkpoint_state import CheckpointProgress, ProgressError, run_snapshot
from rcpflow.gate import passing_step_below
from tasks.run.spec import RunSpec

TrainingState = Literal["not_started", "running", "succeeded", "failed"]
# A task in one of these states will not run (again) in this DAG run.
_FAILED = frozenset({"failed", "upstream_failed", "skipped", "removed"})
_NOT_STARTED = frozenset({None, "none", "scheduled"})

T = TypeVar("T")


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


class SharedReads:
    """Reads shared by the triggers of one event loop: a read of `key` started less than
    `max_age_s` ago (finished or still in flight) answers instead of a new one."""

    # A finished read this old is dropped when another read starts: a triggerer runs for
    # months and sees many runs.
    keep_s = 60.0

    def __init__(self) -> None:
        self._reads: dict[tuple[Any, ...], tuple[float, asyncio.Future[Any]]] = {}

    def __len__(self) -> int:
        return len(self._reads)

    async def get(
        self, key: tuple[Any, ...], max_age_s: float, read: Callable[[], Awaitable[T]]
    ) -> T:
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        found = self._reads.get(key)
        if found is None or now - found[0] >= max_age_s or found[1].get_loop() is not loop:
            self._drop_finished_before(now - self.keep_s)
            found = (now, asyncio.ensure_future(read()))
            self._reads[key] = found
        # shielded: one waiter cancelled (its task killed) does not cancel the others' read
        result: T = await asyncio.shield(found[1])
        return result

    def _drop_finished_before(self, moment: float) -> None:
        stale = [k for k, (t, f) in self._reads.items() if t < moment and f.done()]
        for key in stale:
            del self._reads[key]


SHARED = SharedReads()


@dataclass(frozen=True)
class WaitTarget:
    """What a wait waits for: `step` of the run of `seed` in `run_dir`, in DAG run `run_id`."""

    run_dir: str
    step: int
    seed: int
    dag_id: str
    run_id: str


Outcome = Literal["committed", "ended", "training_failed", "not_started", "error"]


class _CheckpointWait(BaseTrigger):
    """The polling loop both triggers share."""

    train_group_id: str
    poll_interval_s: float

    async def wait(
        self, target: WaitTarget, start_grace_s: float | None
    ) -> tuple[Outcome, str, CheckpointProgress | None]:
        """Poll until the checkpoint of `target` is committed or will never be. With
        `start_grace_s`, give up (``not_started``) when the train group has not started for
        that long."""
        not_started_since: float | None = None
        while True:
            try:
                progress = await self.progress(target)
            except ProgressError as exc:
                return "error", str(exc), None
            if progress.state != "pending":
                return progress.state, progress.detail, progress
            states = await self.train_task_states(target)
            if not states:
                return (
                    "error",
                    f"no tasks of group {self.train_group_id!r} in {target.run_id}",
                    None,
                )
            training = training_state(states)
            if training == "failed":
                return "training_failed", f"the {self.train_group_id} group failed", None
            if training == "succeeded":
                # Its output check passed after the job ended: read the files afresh, as the
                # last row and block_stop were written before that.
                try:
                    progress = await asyncio.to_thread(
                        lambda: run_snapshot(target.run_dir, target.seed).progress(target.step)
                    )
                except ProgressError as exc:
                    return "error", str(exc), None
                if progress.state != "pending":
                    return progress.state, progress.detail, progress
                return (
                    "ended",
                    f"training finished without a checkpoint of step {target.step}",
                    None,
                )
            if training == "not_started" and start_grace_s is not None:
                now = time.monotonic()
                not_started_since = not_started_since or now
                if now - not_started_since >= start_grace_s:
                    return "not_started", f"the {self.train_group_id} group has not started", None
            else:
                not_started_since = None
            await asyncio.sleep(self.poll_interval_s)

    async def progress(self, target: WaitTarget) -> CheckpointProgress:
        snapshot = await SHARED.get(
            ("files", target.run_dir, target.seed),
            self.poll_interval_s,
            lambda: asyncio.to_thread(run_snapshot, target.run_dir, target.seed),
        )
        return snapshot.progress(target.step)

    async def train_task_states(self, target: WaitTarget) -> Mapping[str, Any]:
        """Task id -> state of the tasks of the train group in this DAG run."""
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
        from asgiref.sync import sync_to_async

        async def read() -> Mapping[str, Any]:
            # as the standard provider's WorkflowTrigger asks: through the supervisor's comms
            found = await sync_to_async(RuntimeTaskInstance.get_task_states)(
                dag_id=target.dag_id, task_group_id=self.train_group_id, run_ids=[target.run_id]
            )
            return dict(found.get(target.run_id, {}))

        key = ("states", target.dag_id, target.run_id, self.train_group_id)
        return await SHARED.get(key, self.poll_interval_s, read)


class CheckpointTrigger(_CheckpointWait):
    """A wait deferred from a worker: poll every `poll_interval_s` until the checkpoint of
    `step` is committed or will never be. One event ``{"state", "step", "detail"}``, state one
    of: ``committed``, ``ended`` (training ended without that row), ``training_failed``,
    ``not_started`` (the train group had not started for `start_grace_s`: the task gives its
    place back and comes again), ``error`` (the run's files are unreadable)."""

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
        self.target = WaitTarget(run_dir, step, seed, dag_id, run_id)
        self.train_group_id = train_group_id
        self.poll_interval_s = poll_interval_s
        self.start_grace_s = start_grace_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        t = self.target
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "run_dir": t.run_dir,
                "step": t.step,
                "seed": t.seed,
                "dag_id": t.dag_id,
                "run_id": t.run_id,
                "train_group_id": self.train_group_id,
                "poll_interval_s": self.poll_interval_s,
                "start_grace_s": self.start_grace_s,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        state, detail, _ = await self.wait(self.target, self.start_grace_s)
        yield TriggerEvent({"state": state, "step": self.target.step, "detail": detail})


class StartedCheckpointTrigger(_CheckpointWait):
    """A wait started on the triggerer, for the task instance it is given: its step is the
    `steps_task_id` XCom at the instance's map index, its run the `plan_task_id` XCom (a
    RunSpec). Ends the task: success once the step's checkpoint is committed; skipped when
    training ended without the row, when training failed, or when a lower step already
    passed; failed when the run's files are unreadable (the reason is in this trigger's
    log)."""

    def __init__(
        self,
        *,
        plan_task_id: str,
        steps_task_id: str,
        train_group_id: str,
        poll_interval_s: float,
    ) -> None:
        super().__init__()
        self.plan_task_id = plan_task_id
        self.steps_task_id = steps_task_id
        self.train_group_id = train_group_id
        self.poll_interval_s = poll_interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "plan_task_id": self.plan_task_id,
                "steps_task_id": self.steps_task_id,
                "train_group_id": self.train_group_id,
                "poll_interval_s": self.poll_interval_s,
            },
        )

    async def resolve(self) -> WaitTarget:
        """The step and run of the task instance this trigger runs for."""
        from asgiref.sync import sync_to_async

        ti = self.task_instance
        if ti is None or not hasattr(ti, "xcom_pull"):
            raise RuntimeError(f"{type(self).__name__} runs only as a task's start trigger")
        pull = sync_to_async(ti.xcom_pull)
        spec = RunSpec.from_dict(await pull(task_ids=self.plan_task_id, map_indexes=-1))
        steps = await pull(task_ids=self.steps_task_id, map_indexes=-1)
        step = steps[ti.map_index]
        return WaitTarget(spec.run_dir, step, spec.seed, ti.dag_id, ti.run_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        target = await self.resolve()
        state, detail, progress = await self.wait(target, start_grace_s=None)
        if state == "error":
            self.log.error("step %d: %s", target.step, detail)
            yield TaskFailedEvent()
            return
        if state != "committed" or progress is None or progress.row is None:
            self.log.info("step %d is not evaluated: %s", target.step, detail)
            yield TaskSkippedEvent()
            return
        row = progress.row
        passed = await asyncio.to_thread(
            passing_step_below, target.run_dir, row.step, progress.rows
        )
        if passed is not None:
            self.log.info(
                "step %d already passed the target; step %d is not evaluated", passed, row.step
            )
            yield TaskSkippedEvent()
            return
        self.log.info("step %d: checkpoint committed at %s", row.step, row.checkpoint_path)
        # No XCom: the step's evaluate reads the row from the manifest (docs/airflow.md).
        yield TaskSuccessEvent()
