"""Triggers that wait on the triggerer for one planned checkpoint of a training run.

Evaluation during training maps over the planned steps before any exists; each step's ``wait``
waits here, holding no worker slot. Two ways in:

- `StartedCheckpointTrigger`: the wait starts on the triggerer (``start_from_trigger``) and
  ends there: it finds its step and run from the DAG run's XComs, and ends the task itself
  (success with the row as its XCom, or skipped), so a waiting step costs no worker process at
  all: dozens of planned steps would otherwise each start one while training runs;
- `CheckpointTrigger`: a wait that started on a worker (``dag.test()``, which runs tasks one
  at a time) defers to it and resumes with its event.

Both read the run's files through `rcpflow.records.checkpoint_state` (the same answer on local
folders and ``gs://``) and ask `rcpflow.verdict.readiness` whether the step goes, waits or is
skipped (the triggers hold no rule of their own); so that a failed or not yet started training
does not leave them waiting until their timeout, they also read the states of the run's
``train`` task group through the Task SDK when the files alone do not answer. On every poll a
wait ends skipped once a lower step's valid summary passes (so the waits above a verdict end at
once, and their evaluate tasks are skipped without a task process). Under
``after_training`` a committed step goes only once training has halted (its ``block_stop``
or the train group's success). A started wait also holds the run's eval window: it lets its
step go only when the step is among the W lowest committed steps whose evaluation has not
ended (`window_admits`), read from the task states of the run's waits and evaluations. The
waits of one run share those reads (`SharedReads`): one per poll for all its steps. Storage
calls are synchronous, so they run in a thread, off the triggerer's event loop. A wait logs
nothing until it ends: the outcome (a skip's reason) is the first line of its log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from airflow.triggers.base import (
    BaseTrigger,
    TaskFailedEvent,
    TaskSkippedEvent,
    TaskSuccessEvent,
    TriggerEvent,
)

from rcpflow.records.checkpoint_state import ProgressError, RunSnapshot, run_snapshot
from rcpflow.records.manifest import ManifestRow
from rcpflow.verdict import gate
from rcpflow.verdict.readiness import Readiness, Reason, TrainingState, readiness, skip_sentence
from rcpflow.verdict.schedule import DEFAULT_SCHEDULE, EvalSchedule
from tasks.jobs.templates import TrainResult
from tasks.names import EVALUATE_TASK_ID
from tasks.run.spec import RunSpec
from tasks.run.train_result import import_for_wait

# A task in one of these states will not run (again) in this DAG run.
_FAILED = frozenset({"failed", "upstream_failed", "skipped", "removed"})
_NOT_STARTED = frozenset({None, "none", "scheduled"})
# A step's evaluation is over (its slot in the eval window is free) once its evaluate task or
# its wait is in one of these.
_EVALUATE_OVER = frozenset({"success", "skipped", "failed", "upstream_failed", "removed"})
_WAIT_OVER = frozenset({"skipped", "failed", "upstream_failed", "removed"})

T = TypeVar("T")


def training_state(states: Mapping[str, Any]) -> TrainingState:
    """The train group's progress from its tasks' states (task id -> state or None): failed,
    succeeded (all), running (one is), else not started."""
    values = [None if s is None else str(s) for s in states.values()]
    if any(s in _FAILED for s in values):
        return "failed"
    if values and all(s == "success" for s in values):
        return "succeeded"
    # none running: a group whose first task (the job's command) ended but whose job has not
    # started is not running yet either (``dag.test()`` runs one task at a time)
    if all(s in _NOT_STARTED or s == "success" for s in values):
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


class Verdicts(dict[tuple[str, int, int], bool]):
    """Whether a row's valid summary passes, by (run_dir, step, weight-update time): a valid
    summary is reused, never evaluated again, so its verdict is read once per row
    (`gate.lowest_passing`'s `known`). A triggerer runs for months and sees many runs: a run's
    verdicts not asked for in `keep_s` are dropped (its waits are over; a later wait reads the
    summary again)."""

    keep_s = 3600.0

    def __init__(self) -> None:
        super().__init__()
        self._asked: dict[str, float] = {}  # run_dir -> when its verdicts were last asked for

    def asked(self, run_dir: str) -> None:
        """Note that `run_dir`'s verdicts were asked for now; drop those of runs not asked for
        in `keep_s`."""
        now = time.monotonic()
        self._asked[run_dir] = now
        stale = {r for r, t in self._asked.items() if now - t >= self.keep_s}
        if stale:
            for key in [k for k in self if k[0] in stale]:
                del self[key]
            for r in stale:
                del self._asked[r]


VERDICTS = Verdicts()


def lowest_passing(run_dir: str, rows: tuple[ManifestRow, ...]) -> int | None:
    """The lowest step of `rows` whose valid summary passes the target (`rcpflow.verdict.gate`),
    with the verdicts known on this triggerer."""
    VERDICTS.asked(run_dir)
    return gate.lowest_passing(run_dir, rows, known=VERDICTS)


def window_admits(
    step: int,
    window: int,
    steps: list[int],
    committed: set[int],
    states: Mapping[str, Any],
    wait_task_id: str,
    evaluate_task_id: str,
) -> bool:
    """Whether `step` may be evaluated now: it is among the `window` lowest committed steps
    whose evaluation is not over (`states`: task id + ``_<map index>`` -> state; map index i
    is steps[i]). Steps commit in step order and a step let go stays in that set until its
    evaluation ends, so at most `window` are let go at a time, lowest first."""

    def over(index: int) -> bool:
        evaluate = states.get(f"{evaluate_task_id}_{index}")
        wait = states.get(f"{wait_task_id}_{index}")
        return str(evaluate) in _EVALUATE_OVER or str(wait) in _WAIT_OVER

    open_steps = sorted(s for i, s in enumerate(steps) if s in committed and not over(i))
    return step in open_steps[:window]


@dataclass(frozen=True)
class WaitTarget:
    """What a wait waits for: `step` of the run of `seed` in `run_dir`, in DAG run `run_id`."""

    run_dir: str
    step: int
    seed: int
    dag_id: str
    run_id: str
    # The run's validation start, where known (a start trigger reads the run's spec): lets a
    # train job's checkpoint tree be imported before its first row (tasks.run.train_result).
    val_start_at: int | None = None
    # The deployment's [jobs.train] result, from the trigger's kwargs: the triggerer does not
    # load the deployment (it has no backend, and so no backend settings table, registered).
    train_result: TrainResult = field(default_factory=TrainResult)


def train_result_kwargs(result: TrainResult) -> dict[str, Any]:
    """`result` as JSON for a trigger's kwargs (`train_result_from_kwargs` is the inverse)."""
    return dataclasses.asdict(result)


def train_result_from_kwargs(kwargs: Mapping[str, Any] | None) -> TrainResult:
    """The TrainResult `train_result_kwargs` wrote; None (a trigger deferred by an earlier
    release): a trainer that records its rows itself."""
    return TrainResult() if kwargs is None else TrainResult(**kwargs)


def read_files(target: WaitTarget) -> RunSnapshot:
    """The run's files as a wait reads them: a train job's new checkpoints imported first."""
    import_for_wait(target.run_dir, target.seed, target.train_result, target.val_start_at)
    return run_snapshot(target.run_dir, target.seed)


Outcome = Reason | Literal["not_started", "error"]
# Asked once the step can be evaluated: may it go now (the eval window)?
Admit = Callable[[RunSnapshot], Awaitable[bool]]


@dataclass(frozen=True)
class WaitEnd:
    """How a wait ended: the outcome, its sentence, and the row when it goes."""

    outcome: Outcome
    detail: str
    row: ManifestRow | None = None


class _CheckpointWait(BaseTrigger):
    """The polling loop both triggers share; the decision is `rcpflow.verdict.readiness`'s."""

    train_group_id: str
    poll_interval_s: float

    async def wait(
        self,
        target: WaitTarget,
        start_grace_s: float | None,
        schedule: EvalSchedule,
        admit: Admit | None = None,
    ) -> WaitEnd:
        """Poll until the checkpoint of `target` can be evaluated (and `admit` lets it go) or
        never will be. With `start_grace_s`, give up (``not_started``) when the train group
        has not started for that long. Each poll reads the run's snapshot once (shared by the
        run's waits); the train group's states only when the files alone do not answer."""
        not_started_since: float | None = None
        while True:
            try:
                snapshot, passed = await self.snapshot(target)
                answer = readiness(target.step, snapshot, passed, schedule)
                training: TrainingState | None = None
                if answer.needs_training:
                    states = await self.train_task_states(target)
                    if not states:
                        return WaitEnd(
                            "error", f"no tasks of group {self.train_group_id!r} in {target.run_id}"
                        )
                    training = training_state(states)
                    if training == "succeeded":
                        # the files as they were once the group succeeded (its output check
                        # passed after the last row and block_stop were written)
                        snapshot, passed = await self.snapshot(target, after=training)
                    answer = readiness(target.step, snapshot, passed, schedule, training)
            except ProgressError as exc:
                return WaitEnd("error", str(exc))
            if answer.decision == "skip":
                return WaitEnd(answer.reason, self._sentence(target.step, answer))
            if answer.decision == "go" and await self.admitted(snapshot, admit):
                # the verdict read afresh: this poll's shared read may predate the summary of
                # the evaluation whose end freed the slot
                try:
                    passed = await asyncio.to_thread(lowest_passing, target.run_dir, snapshot.rows)
                except ProgressError as exc:
                    return WaitEnd("error", str(exc))
                answer = readiness(target.step, snapshot, passed, schedule, training)
                if answer.decision == "skip":
                    return WaitEnd(answer.reason, self._sentence(target.step, answer))
                return WaitEnd("committed", answer.sentence, answer.row)
            if training == "not_started" and start_grace_s is not None:
                now = time.monotonic()
                not_started_since = not_started_since or now
                if now - not_started_since >= start_grace_s:
                    return WaitEnd(
                        "not_started", f"the {self.train_group_id} group has not started"
                    )
            else:
                not_started_since = None
            await asyncio.sleep(self.poll_interval_s)

    def _sentence(self, step: int, answer: Readiness) -> str:
        if answer.reason == "training_failed":
            return skip_sentence(step, "training_failed", train_group=self.train_group_id)
        return answer.sentence

    async def admitted(self, snapshot: RunSnapshot, admit: Admit | None) -> bool:
        """`admit` lets the step go (no `admit`: it goes)."""
        return admit is None or await admit(snapshot)

    async def snapshot(
        self, target: WaitTarget, after: TrainingState | None = None
    ) -> tuple[RunSnapshot, int | None]:
        """The run's files and the lowest passing step, one read shared by the run's waits in a
        poll. `after`: a read started once the train group was seen in that state."""

        async def read() -> tuple[RunSnapshot, int | None]:
            snapshot = await asyncio.to_thread(read_files, target)
            passed = await asyncio.to_thread(lowest_passing, target.run_dir, snapshot.rows)
            return snapshot, passed

        found: tuple[RunSnapshot, int | None] = await SHARED.get(
            ("files", target.run_dir, target.seed, after), self.poll_interval_s, read
        )
        return found

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
    `step` can be evaluated under `schedule` or never will be. One event ``{"state", "step",
    "detail"}``, state one of: ``committed``, ``ended`` (training ended without that row),
    ``decided`` (a lower step passed), ``training_failed``, ``not_started`` (the train group
    had not started for `start_grace_s`: the task gives its place back and comes again),
    ``error`` (the run's files are unreadable). No eval window: a worker-started wait runs
    under ``dag.test()``, one task at a time."""

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
        schedule: EvalSchedule = DEFAULT_SCHEDULE,
        val_start_at: int | None = None,
        train_result: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.target = WaitTarget(
            run_dir,
            step,
            seed,
            dag_id,
            run_id,
            val_start_at,
            train_result_from_kwargs(train_result),
        )
        self.train_group_id = train_group_id
        self.poll_interval_s = poll_interval_s
        self.start_grace_s = start_grace_s
        self.schedule: EvalSchedule = schedule

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
                "schedule": self.schedule,
                "val_start_at": t.val_start_at,
                "train_result": train_result_kwargs(t.train_result),
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # Run in line by ``dag.test()`` (no triggerer: no task instance), nothing else runs
        # while it waits: a train group that has not started will not start meanwhile.
        grace = 0.0 if self.task_instance is None else self.start_grace_s
        end = await self.wait(self.target, grace, self.schedule)
        yield TriggerEvent({"state": end.outcome, "step": self.target.step, "detail": end.detail})


@dataclass(frozen=True)
class StartedWait:
    """What a started wait resolves from its DAG run: its target and the run's plan."""

    target: WaitTarget
    spec: RunSpec
    steps: list[int]
    wait_task_id: str
    evaluate_task_id: str


class StartedCheckpointTrigger(_CheckpointWait):
    """A wait started on the triggerer, for the task instance it is given: its step is the
    `steps_task_id` XCom at the instance's map index, its run the `plan_task_id` XCom (a
    RunSpec, with the run's schedule and eval window). Ends the task: success once the step
    can be evaluated and the window has room for it (`window_admits`, over the states of the
    waits and of the sibling task `evaluate_task` of the run's instances); skipped when
    training ended without the row, when training failed, or when a lower step already
    passed; failed when the run's files are unreadable. The reason is the first line of this
    trigger's log."""

    def __init__(
        self,
        *,
        plan_task_id: str,
        steps_task_id: str,
        train_group_id: str,
        poll_interval_s: float,
        evaluate_task: str = EVALUATE_TASK_ID,
        train_result: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.plan_task_id = plan_task_id
        self.steps_task_id = steps_task_id
        self.train_group_id = train_group_id
        self.poll_interval_s = poll_interval_s
        self.evaluate_task = evaluate_task
        self.train_result = train_result_from_kwargs(train_result)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "plan_task_id": self.plan_task_id,
                "steps_task_id": self.steps_task_id,
                "train_group_id": self.train_group_id,
                "poll_interval_s": self.poll_interval_s,
                "evaluate_task": self.evaluate_task,
                "train_result": train_result_kwargs(self.train_result),
            },
        )

    async def resolve(self) -> StartedWait:
        """The step and run of the task instance this trigger runs for."""
        from asgiref.sync import sync_to_async

        ti = self.task_instance
        if ti is None or not hasattr(ti, "xcom_pull"):
            raise RuntimeError(f"{type(self).__name__} runs only as a task's start trigger")
        pull = sync_to_async(ti.xcom_pull)
        spec = RunSpec.from_dict(await pull(task_ids=self.plan_task_id, map_indexes=-1))
        steps = list(await pull(task_ids=self.steps_task_id, map_indexes=-1))
        step = steps[ti.map_index]
        group = ti.task_id.rpartition(".")[0]
        return StartedWait(
            target=WaitTarget(
                spec.run_dir,
                step,
                spec.seed,
                ti.dag_id,
                ti.run_id,
                spec.effective_val_start_at,
                self.train_result,
            ),
            spec=spec,
            steps=steps,
            wait_task_id=ti.task_id,
            evaluate_task_id=f"{group}.{self.evaluate_task}" if group else self.evaluate_task,
        )

    async def step_states(self, wait: StartedWait) -> Mapping[str, Any]:
        """Task id + ``_<map index>`` -> state of the run's waits and evaluations."""
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
        from asgiref.sync import sync_to_async

        target = wait.target

        async def read() -> Mapping[str, Any]:
            found = await sync_to_async(RuntimeTaskInstance.get_task_states)(
                dag_id=target.dag_id,
                task_ids=[wait.wait_task_id, wait.evaluate_task_id],
                run_ids=[target.run_id],
            )
            return dict(found.get(target.run_id, {}))

        key = ("steps", target.dag_id, target.run_id, wait.wait_task_id)
        return await SHARED.get(key, self.poll_interval_s, read)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        wait = await self.resolve()
        target, spec = wait.target, wait.spec

        async def admit(snapshot: RunSnapshot) -> bool:
            states = await self.step_states(wait)
            return window_admits(
                target.step,
                spec.eval_window,
                wait.steps,
                {r.step for r in snapshot.rows},
                states,
                wait.wait_task_id,
                wait.evaluate_task_id,
            )

        end = await self.wait(target, start_grace_s=None, schedule=spec.eval_schedule, admit=admit)
        if end.outcome == "error":
            self.log.error("step %d: %s", target.step, end.detail)
            yield TaskFailedEvent()
            return
        if end.outcome != "committed" or end.row is None:
            self.log.info("%s", end.detail)
            yield TaskSkippedEvent()
            return
        row = end.row
        self.log.info(
            "step %d: checkpoint committed at %s; evaluated now (%s, eval window %d)",
            row.step,
            row.checkpoint_path,
            spec.eval_schedule,
            spec.eval_window,
        )
        # No XCom: the step's evaluate reads the row from the manifest (docs/airflow.md).
        yield TaskSuccessEvent()
