"""A train job's checkpoints that rcpflow records itself: the deployment's ``[jobs.train]
result`` (`tasks.jobs.templates.TrainResult`), imported into the run's manifest wherever the run
DAG reads it (the output check after training, the checkpoint waits, and the local backend
while its training runs), idempotently: the same tree again writes nothing, new checkpoints
append rows (`rcpflow.trainer.nemo_rl_import`). The run's recorded evaluation schedule (the plan
task's ``eval_schedule.json``) goes with it, so that a tree whose keep_top_k would delete a
checkpoint before its evaluation after training is refused here as by hand; every caller gets it
without carrying the schedule (a wait on the triggerer reads the same run folder).

The caller passes the deployment's `TrainResult`: a wait on the triggerer has it from its
kwargs, never from loading the deployment there (the triggerer has no backend registered)."""

from __future__ import annotations

import logging

from rcpflow.files.layout import RunLayout
from rcpflow.records.checkpoint_state import ProgressError
from rcpflow.records.manifest import ManifestError, read_rows
from rcpflow.records.nemo_rl import NemoRLError
from rcpflow.trainer.nemo_rl_import import CheckpointTreeImport, import_checkpoint_tree
from rcpflow.verdict.schedule import EvalSchedule
from rcpflow.verdict.schedule_record import ScheduleRecordError, read_schedule
from tasks.jobs.templates import TrainResult

log = logging.getLogger(__name__)


def checkpoint_root(run_dir: str, seed: int, result: TrainResult) -> str | None:
    """The tree the train job leaves (`result`: the deployment's ``[jobs.train] result``), None
    when the trainer records rows itself."""
    if not result.imported:
        return None
    layout = RunLayout(run_dir)
    values: dict[str, str | int] = {
        "run_dir": layout.root,
        "seed": seed,
        "checkpoint_dir": layout.checkpoints_dir,
    }
    return result.render(values)


def recorded_schedule(run_dir: str) -> EvalSchedule | None:
    """The schedule the run's plan recorded; None for a run not planned by the run DAG."""
    try:
        record = read_schedule(run_dir)
    except ScheduleRecordError as exc:
        raise NemoRLError(str(exc)) from exc
    return None if record is None else record.eval_schedule


def import_checkpoints(
    run_dir: str,
    seed: int,
    result: TrainResult,
    val_start_at: int | None = None,
    *,
    allow_empty: bool,
) -> CheckpointTreeImport | None:
    """Import the train job's tree, if it leaves one. Without `val_start_at`, only once the
    manifest has rows (they hold it): the first rows come from a caller that knows the run.
    Raises NemoRLError naming the step, file and field (and the keep_top_k that would delete a
    checkpoint before its evaluation after training)."""
    root = checkpoint_root(run_dir, seed, result)
    if root is None:
        return None
    if val_start_at is None:
        try:
            rows = read_rows(RunLayout(run_dir).manifest)
        except ManifestError as exc:
            raise NemoRLError(str(exc)) from exc
        if not rows:
            return None
    found = import_checkpoint_tree(
        run_dir,
        root,
        seed=seed,
        val_start_at=val_start_at,
        allow_empty=allow_empty,
        eval_schedule=recorded_schedule(run_dir),
    )
    if found.added:
        log.info("%s", found.describe())
    return found


def import_for_wait(
    run_dir: str, seed: int, result: TrainResult, val_start_at: int | None = None
) -> None:
    """Before a wait reads the run's files: the train job's new checkpoints into its manifest
    (ProgressError naming the step, file and field when they do not add up)."""
    try:
        import_checkpoints(run_dir, seed, result, val_start_at, allow_empty=True)
    except NemoRLError as exc:
        raise ProgressError(f"checkpoint import: {exc}") from exc
