"""`WaitForCheckpointOperator`: the first half of evaluating a planned step during training.

It succeeds once the step's checkpoint can be evaluated under the run's schedule: committed,
and under ``after_training`` also training halted (the step's ``evaluate`` then reads its row
from the manifest). Under a scheduler it starts and ends on the triggerer
(`tasks.run.triggers.StartedCheckpointTrigger`): no worker process at all while it waits, and
not counted in the eval window, which it holds for its step instead. Started on a worker
(``dag.test()``), it defers to
`tasks.run.triggers.CheckpointTrigger` and resumes with its event. Either way it skips, saying
why, when a lower step already passed (`rcpflow.verdict.gate`), when training ended
without that checkpoint (stopped at the verdict) or when training failed. On a worker, when
the train group has not started (``dag.test()`` runs one task at a time), it gives its place
back and comes again (up_for_reschedule).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, XComArg
from airflow.sdk.exceptions import (
    AirflowFailException,
    AirflowRescheduleException,
    AirflowSkipException,
)
from airflow.triggers.base import StartTriggerArgs

from rcpflow.records.checkpoint_state import ProgressError, RunSnapshot, run_snapshot
from rcpflow.verdict.gate import lowest_passing
from rcpflow.verdict.readiness import Readiness, TrainingState, readiness
from tasks.jobs.templates import TrainResult
from tasks.names import TRAIN_TASK_ID
from tasks.run.spec import RunSpec
from tasks.run.train_result import import_for_wait
from tasks.run.triggers import CheckpointTrigger, StartedCheckpointTrigger, train_result_kwargs

if TYPE_CHECKING:
    from airflow.sdk import Context

log = logging.getLogger(__name__)

# A wait's tries: a wait only reads the run's files and task states, so another try is safe,
# and a wait ended by something passing (a triggerer's error, a storage read that failed, the
# state of its trigger lost) must not end the run's evaluation of that step. A wait that fails
# for the run's own files fails again on every try (the last one's reason is the task's).
WAIT_RETRIES = 2


class WaitForCheckpointOperator(BaseOperator):
    """Wait, deferred, for the checkpoint of `step` of the run of `seed` in `run_dir`.
    `timeout` bounds each try (then it fails; `WAIT_RETRIES` tries more); the run's RunSpec
    (its schedule and eval window) is the XCom of `plan_task_id`, the planned steps that of
    `steps_task_id` (what the triggerer reads too: it has no resolved arguments), the train
    group is
    `train_group_id` of the same DAG run; `train_result` is the deployment's
    ``[jobs.train] result`` (passed on to the triggers, which never load the deployment)."""

    template_fields: Sequence[str] = ("run_dir", "step", "seed")
    ui_color = "#f1f3f4"
    start_from_trigger = True

    def __init__(
        self,
        *,
        run_dir: str | XComArg,  # template fields: an XComArg is resolved before execute
        step: int | XComArg,
        seed: int | XComArg,
        plan_task_id: str,
        steps_task_id: str,
        train_group_id: str = TRAIN_TASK_ID,
        poll_interval_s: float = 5.0,
        timeout: timedelta | None = None,
        train_result: TrainResult,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("retries", WAIT_RETRIES)
        kwargs.setdefault("retry_delay", timedelta(seconds=poll_interval_s))
        super().__init__(**kwargs)
        self.train_result = train_result
        self.run_dir = run_dir
        self.step = step
        self.seed = seed
        self.plan_task_id = plan_task_id
        self.train_group_id = train_group_id
        self.poll_interval_s = poll_interval_s
        self.timeout = timeout
        self.start_trigger_args = StartTriggerArgs(
            trigger_cls=f"{StartedCheckpointTrigger.__module__}.{StartedCheckpointTrigger.__qualname__}",
            trigger_kwargs=StartedCheckpointTrigger(
                plan_task_id=plan_task_id,
                steps_task_id=steps_task_id,
                train_group_id=train_group_id,
                poll_interval_s=poll_interval_s,
                train_result=train_result_kwargs(train_result),
            ).serialize()[1],
            next_method="execute_complete",
            next_kwargs=None,
            timeout=timeout,
        )

    def _args(self) -> tuple[str, int, int]:
        run_dir, step, seed = self.run_dir, self.step, self.seed
        if not isinstance(run_dir, str) or not isinstance(step, int) or not isinstance(seed, int):
            raise TypeError(f"unresolved arguments: {run_dir!r}, {step!r}, {seed!r}")
        return run_dir, step, seed

    def _snapshot(self, val_start_at: int | None) -> RunSnapshot:
        run_dir, step, seed = self._args()
        try:
            import_for_wait(run_dir, seed, self.train_result, val_start_at)
            return run_snapshot(run_dir, seed)
        except ProgressError as exc:
            raise AirflowFailException(f"step {step}: {exc}") from exc

    def _readiness(self, spec: RunSpec, training: TrainingState | None = None) -> Readiness:
        """Whether the step may go now; a train job's checkpoint tree is imported first, from
        the run's validation start (as a started wait does: rows before its first one)."""
        run_dir, step, _ = self._args()
        snapshot = self._snapshot(spec.effective_val_start_at)
        passed = lowest_passing(run_dir, snapshot.rows, below=step)
        return readiness(step, snapshot, passed, spec.eval_schedule, training)

    def _run_spec(self, context: Context) -> RunSpec:
        """The run's spec: the plan's output (as the triggerer reads it)."""
        return RunSpec.from_dict(context["ti"].xcom_pull(task_ids=self.plan_task_id))

    def execute(self, context: Context) -> None:
        spec = self._run_spec(context)
        answer = self._readiness(spec)
        if answer.decision != "wait":
            self._finish(answer)
            return
        dag_run = context["dag_run"]
        run_dir, step, seed = self._args()
        self.defer(
            trigger=CheckpointTrigger(
                run_dir=run_dir,
                step=step,
                seed=seed,
                dag_id=dag_run.dag_id,
                run_id=dag_run.run_id,
                train_group_id=self.train_group_id,
                poll_interval_s=self.poll_interval_s,
                start_grace_s=3 * self.poll_interval_s,
                schedule=spec.eval_schedule,
                val_start_at=spec.effective_val_start_at,
                train_result=train_result_kwargs(self.train_result),
            ),
            method_name="execute_complete",
            timeout=self.timeout,
        )

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> None:
        state, detail = event["state"], event["detail"]
        if state == "error":
            raise AirflowFailException(f"step {self.step}: {detail}")
        if state in ("training_failed", "decided", "ended"):
            log.info("%s", detail)
            raise AirflowSkipException(detail)
        if state == "not_started":
            log.info("step %s: %s; waiting again later", self.step, detail)
            raise AirflowRescheduleException(
                reschedule_date=datetime.now(tz=UTC) + timedelta(seconds=self.poll_interval_s)
            )
        # committed: the trigger saw the step go (under after_training, training had halted)
        answer = self._readiness(self._run_spec(context), training="succeeded")
        if answer.decision == "wait":  # only after a trigger said otherwise: files went back
            raise AirflowFailException(f"step {self.step}: {answer.sentence} after the wait ended")
        self._finish(answer)

    def _finish(self, answer: Readiness) -> None:
        if answer.decision == "skip":
            log.info("%s", answer.sentence)
            raise AirflowSkipException(answer.sentence)
        row = answer.row
        if row is None:
            raise AirflowFailException(f"step {self.step}: committed without a row")
        log.info("step %d: checkpoint committed at %s", row.step, row.checkpoint_path)
