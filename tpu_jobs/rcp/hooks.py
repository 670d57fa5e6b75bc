"""RCP training hooks for a trainer that lets rcpflow save its checkpoints (`RcpHooks`).

The JAX/Orbax layer of `rcpflow.recorder`: the recorder decides the records; the hooks block on
an update before its timestamp, queue a background checkpoint of every step from
``val_start_at`` on, hand its row to the recorder once Orbax has committed it, and choose the
checkpoint a crashed run resumes from. A step is one optimizer update (``samples = step * gbs``).
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import jax

from rcpflow import manifest, recipe
from rcpflow.mllog import MLLogError, SystemInfo, read_events, run_start_ms
from rcpflow.recorder import RecorderError, Resumed, TrainingRecorder
from rcpflow.run_identity import RunIdentity
from rcpflow.storage import storage_for
from tpu_jobs.rcp.checkpoint_format import CheckpointError, SavedCheckpoint
from tpu_jobs.rcp.checkpoint_restore import check_readable
from tpu_jobs.rcp.checkpoint_writer import DEFAULT_MAX_PENDING, CheckpointSaver
from tpu_jobs.rcp.saver import SaveFailedError
from tpu_jobs.rcp.trainer_hooks import ResumePoint

PyTree = Any
RUN_IDENTITY_KEY = "run"
RESUME_PAST_CORRUPT_FLAG = "--resume-past-corrupt"
LOG_LOST = " (it cannot be rebuilt: restore it, or start the run afresh in another run_dir)"
log = logging.getLogger(__name__)


class RunMismatchError(CheckpointError):
    """The run folder holds another run than these arguments describe (a bad argument)."""


class CorruptCheckpointError(CheckpointError):
    """The newest complete checkpoint cannot be restored; `resume(past_corrupt=True)` skips it."""


def run_mismatch(step: int, path: str, found: object, ours: RunIdentity) -> RunMismatchError:
    """The error for a checkpoint of another run (`found`, its recorded arguments) in the run
    folder these arguments (`ours`) describe: it names each flag that differs."""
    return RunMismatchError(
        f"step {step}: checkpoint at {path} belongs to run {found}, not to this one "
        f"{ours.arguments()} ({ours.differing_flags(found)}); resume with that run's arguments, "
        "or use another run_dir"
    )


def check_log(path: str, newest: int) -> bool:
    """The log a resume continues: there, readable, with the run's start; True when it has
    already ended (``block_stop``). Raises `CheckpointError` naming what is wrong."""
    where = f"cannot resume at step {newest}: the run's MLLOG {path}"
    if not storage_for(path).exists(path):
        raise CheckpointError(f"{where} is missing{LOG_LOST}")
    try:
        events = read_events(path)
    except MLLogError as e:
        raise CheckpointError(f"cannot resume at step {newest}: {e}{LOG_LOST}") from e
    keys = [e.key for e in events]
    if run_start_ms(events) is None or "block_start" not in keys:
        raise CheckpointError(f"{where} has no run_start/block_start (cut short?){LOG_LOST}")
    return "block_stop" in keys


@dataclass(frozen=True)
class Committed:
    """A complete checkpoint as its manifest row records it."""

    step: int
    path: str
    timestamp_ms: int  # the update's time, recorded in the checkpoint at save
    weights_fingerprint: str


def resume_recorder(
    recorder: TrainingRecorder,
    complete: Sequence[int],
    *,
    path_of: Callable[[int], str],
    committed: Callable[[int], Committed],
) -> Resumed | None:
    """Resume `recorder` over a trainer's `complete` checkpoints (steps from val_start_at,
    ascending, at least one): every current row must point at one of them; those above the last
    row (the crash came between a commit and its row) get the row they would have had, with the
    update time recorded in the checkpoint (`committed(step)`, read only for them). The
    recorder's refusals (rows or log not this run's) are raised as `CheckpointError`."""
    if recorder.rcp_logging:
        check_log(recorder.mllog_path, complete[-1])
    try:
        return _resume(recorder, complete, path_of, committed)
    except RecorderError as e:
        raise CheckpointError(str(e)) from e


def _resume(
    recorder: TrainingRecorder,
    complete: Sequence[int],
    path_of: Callable[[int], str],
    committed: Callable[[int], Committed],
) -> Resumed | None:
    resumed = recorder.resume()
    last_row = None if resumed is None else resumed.step
    if last_row is not None:
        # The recorder's rows are contiguous from val_start_at.
        for step in range(recorder.val_start_at, last_row + 1):
            if step not in complete:
                raise CheckpointError(
                    f"step {step}: manifest row points at {path_of(step)}, which is not a "
                    "complete checkpoint (deleted by hand?); refusing to resume over it"
                )
    missing = [committed(s) for s in complete if last_row is None or s > last_row]
    if resumed is None and missing:
        # Neither log nor row (rcp_logging off, the crash before the first row): the first
        # checkpoint's update time stands in for run_start, as the rows' would.
        recorder.on_run_start(time_ms=missing[0].timestamp_ms)
    for c in missing:
        recorder.on_update(c.step, timestamp_ms=c.timestamp_ms)
        recorder.on_checkpoint_committed(
            c.step, c.path, {"weights_fingerprint": c.weights_fingerprint}
        )
    return resumed


class RcpHooks:
    """Per-run hooks. In another trainer's loop (MaxText, Tunix, ...)::

        hp = recipe.hyperparameters("closed", global_batch_size=gbs, max_steps=40)
        hooks = RcpHooks(run_dir, seed, hp, val_start_at=recipe.val_start_at(gbs))
        resumed = hooks.resume(params_like=params, state_like=opt_state)  # None: fresh run
        first_step = 1
        if resumed is not None:
            params, opt_state = resumed.params, resumed.state
            first_step = hp.max_steps + 1 if resumed.finished else resumed.step + 1
        hooks.on_init_start()        # no-op when resumed: the run's log continues
        ...compile, warm up...
        hooks.on_run_start()
        with hooks:                  # on an exception: finish queued saves, no block_stop
            for step in range(first_step, hp.max_steps + 1):
                params, opt_state = train_step(params, opt_state, batch(step))
                hooks.after_update(step, params, opt_state)
            hooks.on_train_end()     # waits for the saves and their rows, then block_stop

    Saving, fingerprinting and the manifest row run in the saver's thread: they compete with
    the training step for CPU only, never by making the loop wait.
    """

    def __init__(
        self,
        run_dir: str,
        seed: int,
        hyperparameters: recipe.Hyperparameters,
        val_start_at: int,
        *,
        rcp_logging: bool = True,
        system: SystemInfo | None = None,
        train_samples: int | None = None,
        checkpoint_extra: Mapping[str, Any] | None = None,
        max_pending_saves: int = DEFAULT_MAX_PENDING,
    ) -> None:
        if RUN_IDENTITY_KEY in (checkpoint_extra or {}):
            raise ValueError(f"checkpoint_extra must not use the reserved key {RUN_IDENTITY_KEY!r}")

        def new_recorder() -> TrainingRecorder:
            return TrainingRecorder(
                run_dir,
                seed=seed,
                hyperparameters=hyperparameters,
                val_start_at=val_start_at,
                system=system,
                rcp_logging=rcp_logging,
                train_samples=train_samples,
            )

        # A resume past a corrupt checkpoint starts over with a recorder that has not read the
        # manifest yet.
        self._new_recorder = new_recorder
        self.recorder = new_recorder()
        self.layout = self.recorder.layout
        self.val_start_at = val_start_at
        # The saver's thread hands each checkpoint to the recorder right after it commits.
        self.saver = CheckpointSaver(
            self.layout.checkpoints_dir, max_pending=max_pending_saves, on_commit=self._record_row
        )
        self._identity = RunIdentity(
            seed=seed,
            global_batch_size=hyperparameters.global_batch_size,
            val_start_at=val_start_at,
            max_steps=hyperparameters.max_steps,
            run_start_ms=None,  # a checkpoint records only the arguments
        )
        self._extra = {**dict(checkpoint_extra or {}), RUN_IDENTITY_KEY: self._identity.arguments()}

    @property
    def mllog_path(self) -> str:
        return self.recorder.mllog_path

    @property
    def last_update(self) -> tuple[int, int] | None:
        """(step, timestamp_ms) of the last weight update seen (or restored), if any."""
        return self.recorder.last_update

    def _record_row(self, saved: SavedCheckpoint) -> None:
        self.recorder.on_checkpoint_committed(
            saved.step, saved.path, {"weights_fingerprint": saved.meta.weights_fingerprint}
        )

    def _committed(self, step: int) -> Committed:
        meta = self.saver.read_meta(step)
        return Committed(
            step, self.saver.step_path(step), meta.timestamp_ms, meta.weights_fingerprint
        )

    # -- resume ---------------------------------------------------------------------------

    def resume(
        self, params_like: PyTree, state_like: PyTree, *, past_corrupt: bool = False
    ) -> ResumePoint | None:
        """Restore the newest complete checkpoint of this run, or None if there is none.

        Call before `on_init_start`. The recorder resumes from the manifest and the log first
        (`resume_recorder`): a complete checkpoint above its last row (the crash came between
        the commit and the row) gets the row it would have had; a current row pointing at no
        complete checkpoint is an error, never papered over. Then the newest is restored.
        A newest checkpoint that cannot be restored raises `CorruptCheckpointError`; with
        `past_corrupt` it is deleted with its row instead and the one before it is resumed, so
        that step is trained (and its row written) again.
        """
        complete = [s for s in self.saver.complete_steps() if s >= self.val_start_at]
        if not complete:
            return None
        newest = complete[-1]
        path = self.saver.step_path(newest)
        try:
            meta = self.saver.read_meta(newest)
        except Exception as e:  # whatever Orbax raises on a broken folder
            return self._past_corrupt(newest, e, params_like, state_like, past_corrupt)
        found = meta.extra.get(RUN_IDENTITY_KEY)
        if found != self._identity.arguments():
            raise run_mismatch(newest, path, found, self._identity)
        # Before the restore, which may take minutes: the log and the manifest are checked here.
        resumed = resume_recorder(
            self.recorder, complete, path_of=self.saver.step_path, committed=self._committed
        )
        try:
            params, state, meta = self.saver.restore_train_state(newest, params_like, state_like)
        except Exception as e:  # a complete checkpoint of this run that will not load
            try:
                check_readable(path)
            except Exception as broken:  # broken on storage, not just unlike the targets
                return self._past_corrupt(newest, broken, params_like, state_like, past_corrupt)
            raise CheckpointError(
                f"step {newest}: {path} reads on its own but not into this trainer's params "
                f"and state (another model?): {textwrap.shorten(str(e), 400)}"
            ) from e
        return ResumePoint(
            step=newest,
            params=params,
            state=state,
            timestamp_ms=meta.timestamp_ms,
            finished=resumed is not None and resumed.finished,
        )

    def _past_corrupt(
        self,
        step: int,
        error: Exception,
        params_like: PyTree,
        state_like: PyTree,
        past_corrupt: bool,
    ) -> ResumePoint | None:
        path = self.saver.step_path(step)
        reason = textwrap.shorten(f"{type(error).__name__}: {error}", 400, placeholder=" ...")
        if not past_corrupt:
            raise CorruptCheckpointError(
                f"step {step}: the newest checkpoint {path} cannot be restored ({reason}); "
                f"resume past it ({RESUME_PAST_CORRUPT_FLAG}) to delete it and train step "
                f"{step} again"
            ) from error
        # The resume continues this log: it must be there, readable, and not ended.
        if self.recorder.rcp_logging and check_log(self.mllog_path, step):
            raise CheckpointError(
                f"step {step}: the newest checkpoint {path} cannot be restored ({reason}), and "
                "the run's MLLOG has already ended (block_stop): its last step cannot be trained "
                "again; start the run afresh in another run_dir"
            ) from error
        self.saver.delete(step)
        manifest.remove(self.layout.manifest, step)
        log.warning("step %d: deleted the checkpoint that cannot be restored (%s)", step, reason)
        self.recorder = self._new_recorder()  # one that has not read the removed row
        return self.resume(params_like, state_like, past_corrupt=True)

    # -- the training loop ----------------------------------------------------------------

    def on_init_start(self, time_ms: int | None = None) -> None:
        """Start the MLLOG afresh (a no-op when resumed): see `TrainingRecorder.on_init_start`."""
        self.recorder.on_init_start(time_ms)

    def on_run_start(self, time_ms: int | None = None) -> None:
        """``init_stop``, ``run_start`` and the training block's ``block_start``."""
        self.recorder.on_run_start(time_ms)

    def after_update(self, step: int, params: PyTree, state: PyTree) -> int:
        """Call right after optimizer update number `step`; returns its timestamp_ms.

        Blocks until `params` are computed, takes the timestamp (the recorder's), then (from
        val_start_at on) copies `params` and `state` to host memory and queues their save; it
        waits for earlier saves only when `max_pending_saves` of them are unfinished. The
        trainer must not donate `params` or `state` before this returns; afterwards the save
        holds its own host copy. Raises `tpu_jobs.rcp.saver.SaveFailedError` if an earlier save
        failed (its step is named).
        """
        last = self.recorder.last_update
        # One call per update: a skipped step would leave a hole in the per-step checkpoints.
        if last is not None and step != last[0] + 1:
            raise ValueError(
                f"step {step}: expected step {last[0] + 1} (steps are updates, 1 apart)"
            )
        jax.block_until_ready(params)
        timestamp_ms = self.recorder.on_update(step)
        if step >= self.val_start_at:
            self.saver.save(step, params, state, timestamp_ms=timestamp_ms, extra=self._extra)
        return timestamp_ms

    def stop_requested(self) -> bool:
        """After a step: has the orchestrator asked this run to stop, its verdict decided?
        (`TrainingRecorder.stop_requested`); then end with `on_train_end`, which finishes the
        queued saves and their rows."""
        return self.recorder.stop_requested()

    def flush(self) -> None:
        """Block until every queued save has committed and has its row (e.g. before the trainer
        exits on a preemption notice); raises `SaveFailedError` if one failed."""
        self.saver.wait()

    def on_train_end(self) -> None:
        """Wait for the queued saves and their rows, then log ``block_stop`` backdated to the
        last weight update. Idempotent; a resumed run that had already ended logs nothing."""
        self.flush()
        self.saver.close()
        self.recorder.on_train_end()

    # -- error path -----------------------------------------------------------------------

    def __enter__(self) -> RcpHooks:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        # Training failed: finish the queued saves of updates that did complete, with their rows
        # (a resume continues from them), but end nothing: no block_stop for an unfinished run.
        try:
            self.saver.close()
        except SaveFailedError as e:
            if not isinstance(exc, SaveFailedError):  # else it is the failure being raised
                exc.add_note(f"(also: a checkpoint save failed: {e})")
        except Exception as e:
            exc.add_note(f"(also: closing the checkpoint saver failed: {e})")
