"""RCP training hooks for a trainer that lets rcpflow save its checkpoints (`RcpHooks`).

The JAX/Orbax layer of `rcpflow.trainer.recorder`: the recorder decides the records; the hooks block
on an update (through its weights fingerprint, a replicated value that depends on every process's
shards) before its timestamp, save a collective checkpoint of every step from ``val_start_at``
on (its weights; the full train state every `full_state_every` steps, the last
`keep_full_states` of them kept), hand its row to the recorder once Orbax has committed it, and
choose the checkpoint a crashed run resumes from: the newest full state, the weights-only steps
after it trained again. A step is one optimizer update (``samples = step * gbs``).
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import jax

from rcpflow import recipe
from rcpflow.files.storage import storage_for
from rcpflow.records import manifest
from rcpflow.records.mllog import MLLogError, SystemInfo, read_events, run_start_ms
from rcpflow.records.run_identity import RunIdentity
from rcpflow.trainer.recorder import RecorderError, Resumed, TrainingRecorder
from tpu_jobs.rcp import collectives
from tpu_jobs.rcp.checkpoint_format import CheckpointError, SavedCheckpoint
from tpu_jobs.rcp.checkpoint_restore import check_readable
from tpu_jobs.rcp.checkpoint_writer import DEFAULT_MAX_PENDING, CheckpointSaver
from tpu_jobs.rcp.fingerprint import start_fingerprint, verify_fingerprint
from tpu_jobs.rcp.saver import SaveFailedError
from tpu_jobs.rcp.trainer_hooks import ResumePoint

PyTree = Any
RUN_IDENTITY_KEY = "run"
RESUME_PAST_CORRUPT_FLAG = "--resume-past-corrupt"
FULL_STATE_EVERY_FLAG = "--full-state-every"
KEEP_FULL_STATES_FLAG = "--keep-full-states"
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
        resumed = recorder.resume()
        unsaved = recorder.row_without_checkpoint(complete)
        if unsaved is not None:
            raise CheckpointError(
                f"step {unsaved}: manifest row points at {path_of(unsaved)}, which is not a "
                "complete checkpoint (deleted by hand?); refusing to resume over it"
            )
        last_row = None if resumed is None else resumed.step
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
    except RecorderError as e:
        raise CheckpointError(str(e)) from e


def resume_committed(
    recorder: TrainingRecorder,
    committed: Mapping[int, Committed],
    *,
    path_of: Callable[[int], str],
) -> Resumed | None:
    """`resume_recorder` for a trainer that has read its run's complete checkpoints already
    (`committed`, by step); None, nothing resumed, when there is none (a fresh run)."""
    if not committed:
        return None
    return resume_recorder(
        recorder, sorted(committed), path_of=path_of, committed=committed.__getitem__
    )


def is_full_state_step(step: int, val_start_at: int, every: int) -> bool:
    """Whether step `step`'s checkpoint holds the train state: every `every`-th from
    val_start_at (the others hold the weights the evaluator needs, and meta)."""
    return step >= val_start_at and (step - val_start_at) % every == 0


def save_update(
    saver: CheckpointSaver,
    step: int,
    params: PyTree,
    state: PyTree,
    *,
    timestamp: Callable[[], int],
    full_state_every: int,
    val_start_at: int,
    extra: Mapping[str, Any] | None = None,
) -> int:
    """Every process, right after update `step`: block until the update is computed on every
    process (`collectives.wait_everywhere`, a collective whose cost grows with the number of
    leaves, not their size), take ``timestamp()``, and from `val_start_at` on queue the step's
    save with its fingerprint started on the device (both finish in the saver's thread).
    Returns the timestamp."""
    collectives.wait_everywhere(params)
    timestamp_ms = timestamp()
    if step >= val_start_at:
        full = is_full_state_step(step, val_start_at, full_state_every)
        saver.save(
            step,
            params,
            state if full else None,
            timestamp_ms=timestamp_ms,
            extra=extra,
            fingerprint=start_fingerprint(params),
        )
    return timestamp_ms


def restore_point(
    saver: CheckpointSaver, step: int, finished: bool, params_like: PyTree, state_like: PyTree
) -> ResumePoint | None:
    """Every process: the resume point process 0 chose (`step` 0: a fresh run). Each process
    reads its shards and the weights are verified together (also for a run that has ended, so
    a broken newest checkpoint is found); a restore that fails on any process fails on all."""
    if step == 0:
        return None
    saver.reload()
    if finished and not saver.has_state(step):
        return ResumePoint(step, params_like, state_like, timestamp_ms=0, finished=True)
    error: Exception | None = None
    try:
        params, state, meta = saver.restore_train_state(step, params_like, state_like, verify=False)
    except Exception as e:  # whatever Orbax raises; every process must still agree below
        error = e
    [failed] = collectives.any_process([error is not None])
    if failed:
        why = "" if error is None else f": {textwrap.shorten(repr(error), 400)}"
        raise CorruptCheckpointError(
            f"step {step}: {saver.step_path(step)} cannot be restored on every process{why}"
        ) from error
    verify_fingerprint(params, meta.weights_fingerprint, where=saver.step_path(step))
    return ResumePoint(step, params, state, timestamp_ms=meta.timestamp_ms, finished=finished)


class RcpHooks:
    """Per-run hooks of process 0 (the others run `tpu_jobs.rcp.distributed.FollowerHooks`).
    In another trainer's loop (MaxText, Tunix, ...)::

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

    Saving a checkpoint and writing its manifest row run in the saver's and Orbax's threads: the
    loop waits for the update on every process, and for the saver only when saves outlast
    steps.
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
        full_state_every: int = 1,
        keep_full_states: int | None = None,
    ) -> None:
        if RUN_IDENTITY_KEY in (checkpoint_extra or {}):
            raise ValueError(f"checkpoint_extra must not use the reserved key {RUN_IDENTITY_KEY!r}")
        if full_state_every < 1:
            raise ValueError(f"full_state_every must be >= 1, got {full_state_every}")
        if keep_full_states is not None and keep_full_states < 1:
            raise ValueError(f"keep_full_states must be >= 1, got {keep_full_states}")

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

        # A resume past a corrupt checkpoint, or from a full state older than the last row,
        # starts over with a recorder that has not read the removed rows.
        self._new_recorder = new_recorder
        self.recorder = new_recorder()
        self.layout = self.recorder.layout
        self.val_start_at = val_start_at
        self.full_state_every = full_state_every
        self.keep_full_states = keep_full_states
        # The watcher's thread hands each checkpoint to the recorder right after it commits.
        self.saver = CheckpointSaver(
            self.layout.checkpoints_dir, max_pending=max_pending_saves, on_commit=self._on_commit
        )
        self._identity = RunIdentity(
            seed=seed,
            global_batch_size=hyperparameters.global_batch_size,
            val_start_at=val_start_at,
            max_steps=hyperparameters.max_steps,
            run_start_ms=None,  # a checkpoint records only the arguments
        )
        self._extra = {**dict(checkpoint_extra or {}), RUN_IDENTITY_KEY: self._identity.arguments()}
        self._full_states: list[int] = []  # committed full states of this process's life

    @property
    def mllog_path(self) -> str:
        return self.recorder.mllog_path

    @property
    def save_wait_s(self) -> float:
        return self.saver.waited_s

    @property
    def last_update(self) -> tuple[int, int] | None:
        """(step, timestamp_ms) of the last weight update seen (or restored), if any."""
        return self.recorder.last_update

    def _on_commit(self, saved: SavedCheckpoint) -> None:
        self.recorder.on_checkpoint_committed(
            saved.step, saved.path, {"weights_fingerprint": saved.meta.weights_fingerprint}
        )
        if not is_full_state_step(saved.step, self.val_start_at, self.full_state_every):
            return
        self._full_states.append(saved.step)
        if self.keep_full_states is not None:
            # Older full states go once a newer one has committed; their weights stay.
            while len(self._full_states) > self.keep_full_states:
                self.saver.drop_state(self._full_states.pop(0))

    def _committed(self, step: int) -> Committed:
        meta = self.saver.read_meta(step)
        return Committed(
            step, self.saver.step_path(step), meta.timestamp_ms, meta.weights_fingerprint
        )

    # -- resume ---------------------------------------------------------------------------

    def plan_resume(self) -> tuple[int, bool]:
        """Process 0, before any restore: (step to restore, the run already ended); (0, False)
        for a fresh run. Call before `on_init_start`.

        The newest complete checkpoint must be this run's. The step restored is the newest
        that holds a full train state; the weights-only checkpoints after it (and their rows)
        are deleted, rows first, and those steps are trained again, so a row never names
        weights other than its checkpoint's. The recorder then resumes from the manifest and
        the log (`resume_recorder`): a complete checkpoint above its last row (the crash came
        between the commit and the row) gets the row it would have had; a current row pointing
        at no complete checkpoint is an error, never papered over."""
        complete = [s for s in self.saver.complete_steps() if s >= self.val_start_at]
        if not complete:
            return 0, False
        newest = complete[-1]
        path = self.saver.step_path(newest)
        meta = self.saver.read_meta(newest)
        found = meta.extra.get(RUN_IDENTITY_KEY)
        if found != self._identity.arguments():
            raise run_mismatch(newest, path, found, self._identity)
        ended = self.recorder.rcp_logging and check_log(self.mllog_path, newest)
        full = [s for s in complete if self.saver.has_state(s)]
        if not ended:
            if not full:
                raise CheckpointError(
                    f"cannot resume: no checkpoint of {self.saver.directory} holds a train "
                    f"state (steps {complete[0]}..{newest} are weights only; deleted by hand?)"
                )
            if full[-1] < newest:
                self._drop_after(full[-1], [s for s in complete if s > full[-1]])
                complete = [s for s in complete if s <= full[-1]]
        self._full_states = full[-(self.keep_full_states or len(full)) :] if full else []
        resumed = resume_recorder(
            self.recorder, complete, path_of=self.saver.step_path, committed=self._committed
        )
        finished = resumed is not None and resumed.finished
        if not full:  # an ended run whose train states are all gone: nothing to restore
            return complete[-1], finished
        return full[-1], finished

    def _drop_after(self, full: int, later: Sequence[int]) -> None:
        for step in sorted(later, reverse=True):
            manifest.remove(self.layout.manifest, step)
        for step in sorted(later, reverse=True):
            self.saver.delete(step)
        log.warning(
            "resuming from the full train state of step %d: deleted the weights-only "
            "checkpoints and rows of steps %s, which are trained again",
            full,
            list(later),
        )
        self.recorder = self._new_recorder()

    def resume(
        self, params_like: PyTree, state_like: PyTree, *, past_corrupt: bool = False
    ) -> ResumePoint | None:
        """Restore the newest full train state of this run (`plan_resume`), or None if there is
        none. On several processes process 0 plans, every process restores its shards
        (`restore_point`); the others call `FollowerHooks.resume` at the same time.

        One process: a newest full state that cannot be restored raises
        `CorruptCheckpointError`; with `past_corrupt` it is deleted with its row instead and the
        one before it is resumed, so that step is trained (and its row written) again."""
        if jax.process_count() > 1:
            try:
                step, finished = self.plan_resume()
            except BaseException:
                collectives.from_primary([1, 0, 0])  # the others exit too, instead of waiting
                raise
            collectives.from_primary([0, step, int(finished)])
            return restore_point(self.saver, step, finished, params_like, state_like)
        while True:
            try:
                step, finished = self.plan_resume()
            except CheckpointError:
                raise
            except Exception as e:  # whatever Orbax raises on a broken newest folder
                newest = self.saver.complete_steps()[-1]
                self._past_corrupt(newest, e, past_corrupt)
                continue
            if step == 0 or (finished and not self.saver.has_state(step)):
                return restore_point(self.saver, step, finished, params_like, state_like)
            path = self.saver.step_path(step)
            try:
                params, state, meta = self.saver.restore_train_state(step, params_like, state_like)
            except Exception as e:  # a complete checkpoint of this run that will not load
                try:
                    check_readable(path)
                except Exception as broken:  # broken on storage, not just unlike the targets
                    self._past_corrupt(step, broken, past_corrupt)
                    continue
                raise CheckpointError(
                    f"step {step}: {path} reads on its own but not into this trainer's params "
                    f"and state (another model?): {textwrap.shorten(str(e), 400)}"
                ) from e
            return ResumePoint(
                step=step, params=params, state=state, timestamp_ms=meta.timestamp_ms,
                finished=finished,
            )  # fmt: skip

    def _past_corrupt(self, step: int, error: Exception, past_corrupt: bool) -> None:
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
        later = [s for s in self.saver.complete_steps() if s > step]
        for s in sorted([*later, step], reverse=True):
            manifest.remove(self.layout.manifest, s)
        for s in sorted([*later, step], reverse=True):
            self.saver.delete(s)
        log.warning("step %d: deleted the checkpoint that cannot be restored (%s)", step, reason)
        self.recorder = self._new_recorder()  # one that has not read the removed row

    # -- the training loop ----------------------------------------------------------------

    def on_init_start(self, time_ms: int | None = None) -> None:
        """Start the MLLOG afresh (a no-op when resumed): see `TrainingRecorder.on_init_start`."""
        self.recorder.on_init_start(time_ms)

    def on_run_start(self, time_ms: int | None = None) -> None:
        """``init_stop``, ``run_start`` and the training block's ``block_start``."""
        self.recorder.on_run_start(time_ms)

    def after_update(self, step: int, params: PyTree, state: PyTree) -> int:
        """Call right after optimizer update number `step` (every process); its timestamp_ms.

        Blocks until the update is computed on every process, takes the timestamp (the
        recorder's), then (from val_start_at on) queues the step's save (`save_update`): its
        weights, and its train state on full-state steps. The arrays are held until Orbax has
        copied them: do not donate them to the next step. Waits only while the saver has
        `max_pending_saves` steps unfinished. Raises `tpu_jobs.rcp.saver.SaveFailedError` if
        an earlier save failed (its step is named).
        """
        last = self.recorder.last_update
        # One call per update: a skipped step would leave a hole in the per-step checkpoints.
        if last is not None and step != last[0] + 1:
            raise ValueError(
                f"step {step}: expected step {last[0] + 1} (steps are updates, 1 apart)"
            )
        return save_update(
            self.saver,
            step,
            params,
            state,
            timestamp=lambda: self.recorder.on_update(step),
            full_state_every=self.full_state_every,
            val_start_at=self.val_start_at,
            extra=self._extra,
        )

    def stop_requested(self) -> bool:
        """After a step: has the orchestrator asked this run to stop, its verdict decided?
        (`TrainingRecorder.stop_requested`); then end with `on_train_end`, which finishes the
        queued saves and their rows."""
        return self.recorder.stop_requested()

    def flush(self) -> None:
        """Block until every save has committed and has its row (e.g. before the trainer exits
        on a preemption notice); raises `SaveFailedError` if one failed."""
        self.saver.wait()

    def on_train_end(self) -> None:
        """Wait for the saves and their rows, then log ``block_stop`` backdated to the last
        weight update. Idempotent; a resumed run that had already ended logs nothing."""
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
        # Training failed: finish the saves of updates that did complete, with their rows
        # (a resume continues from them), but end nothing: no block_stop for an unfinished run.
        close_after_failure(self.saver, exc)


def close_after_failure(saver: CheckpointSaver, exc: BaseException) -> None:
    """Close `saver` while `exc` unwinds the loop; its own failure becomes a note on `exc`."""
    try:
        saver.close()
    except SaveFailedError as e:
        if not isinstance(exc, SaveFailedError):  # else it is the failure being raised
            exc.add_note(f"(also: a checkpoint save failed: {e})")
    except Exception as e:
        exc.add_note(f"(also: closing the checkpoint saver failed: {e})")
