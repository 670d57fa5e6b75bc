"""RCP training hooks: what any trainer calls to produce a compliant ``qwen35_397b_grpo`` run.

The hooks decide the training section of the MLLOG (ending in a ``block_stop`` backdated to the
last weight update), each step's weight-update timestamp (taken once the update has completed),
from ``val_start_at`` on a background checkpoint of every step with its manifest row, and how a
crashed run resumes. They see params and state only as pytrees of arrays; a step is one optimizer
update, so ``samples_count = step * gbs``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import jax

from rcpflow import manifest, recipe
from rcpflow.layout import RunLayout, join
from rcpflow.mllog import SystemInfo, TrainingLog, read_events, run_start_ms
from rcpflow.storage import storage_for
from tpu_jobs.checkpoint import (
    DEFAULT_MAX_PENDING,
    CheckpointError,
    CheckpointSaver,
    SavedCheckpoint,
)
from tpu_jobs.saver import SaveFailedError

PyTree = Any
RUN_IDENTITY_KEY = "run"
# A clock behind the previous update's timestamp by more than this is an error, not a wait.
CLOCK_STEP_BACK_MS = 1000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues: the restored state after `step` updates."""

    step: int
    params: PyTree
    state: PyTree
    timestamp_ms: int
    # The log already has its block_stop: training had ended; only on_train_end() may follow.
    finished: bool


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

    Saving, fingerprinting and the manifest upsert run in the saver's thread: they compete with
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
        hp = hyperparameters
        if not 1 <= val_start_at <= hp.max_steps:
            raise ValueError(
                f"val_start_at {val_start_at} must be in 1..max_steps ({hp.max_steps}): no "
                "checkpoint would ever be evaluated"
            )
        if RUN_IDENTITY_KEY in (checkpoint_extra or {}):
            raise ValueError(f"checkpoint_extra must not use the reserved key {RUN_IDENTITY_KEY!r}")
        self.layout = RunLayout(run_dir)
        self.seed = seed
        self.hp = hp
        self.val_start_at = val_start_at
        self.rcp_logging = rcp_logging
        self.system = system if system is not None else SystemInfo()
        self.train_samples = (
            hp.max_steps * hp.global_batch_size if train_samples is None else train_samples
        )
        # The saver's thread upserts each row right after its checkpoint commits, in step order.
        self.saver = CheckpointSaver(
            self.layout.checkpoints_dir, max_pending=max_pending_saves, on_commit=self._record_row
        )
        self._identity = {
            "seed": seed,
            "global_batch_size": hp.global_batch_size,
            "val_start_at": val_start_at,
            "max_steps": hp.max_steps,
        }
        self._extra = {**dict(checkpoint_extra or {}), RUN_IDENTITY_KEY: self._identity}
        self._log: TrainingLog | None = None
        self._resumed = False
        self._ended = False
        self._last_step: int | None = None
        self._last_update_ms: int | None = None

    # -- paths and rows -------------------------------------------------------------------

    @property
    def mllog_path(self) -> str:
        return self.layout.mllog(self.seed)

    def _row(self, saved: SavedCheckpoint) -> manifest.ManifestRow:
        hp = self.hp
        # Relative to the manifest's folder, so a run folder can be copied (gs:// <-> local).
        return manifest.ManifestRow(
            step=saved.step,
            checkpoint_path=join("..", "checkpoints", str(saved.step)),
            timestamp_ms=saved.meta.timestamp_ms,
            samples_count=saved.step * hp.global_batch_size,
            global_batch_size=hp.global_batch_size,
            batch_size=hp.num_prompts_per_step,
            num_generations=hp.num_generations_per_prompt,
            val_start_at=self.val_start_at,
            max_steps=hp.max_steps,
            target_accuracy=recipe.TARGET_ACCURACY,
            seed=self.seed,
            mllog_file=f"seed_{self.seed}.out",
            weights_fingerprint=saved.meta.weights_fingerprint,
        )

    def _record_row(self, saved: SavedCheckpoint) -> None:
        manifest.upsert(self.layout.manifest, self._row(saved))

    # -- resume ---------------------------------------------------------------------------

    def resume(self, params_like: PyTree, state_like: PyTree) -> ResumePoint | None:
        """Restore the newest complete checkpoint of this run, or None if there is none.

        Call before `on_init_start`. Repairs the manifest first: a complete checkpoint without
        its row (the crash came between the commit and the upsert) gets the row it would have
        had; a current row pointing at no complete checkpoint is an error, never papered over.
        """
        complete = [s for s in self.saver.complete_steps() if s >= self.val_start_at]
        if not complete:
            return None
        newest = complete[-1]
        meta = self.saver.read_meta(newest)
        found = meta.extra.get(RUN_IDENTITY_KEY)
        if found != self._identity:
            raise CheckpointError(
                f"step {newest}: checkpoint at {self.saver.step_path(newest)} belongs to run "
                f"{found}, not to this one {self._identity}; use another run_dir"
            )
        run_start = None
        if self.rcp_logging:
            if not storage_for(self.mllog_path).exists(self.mllog_path):
                raise CheckpointError(
                    f"cannot resume at step {newest}: the run's MLLOG {self.mllog_path} is missing"
                )
            events = read_events(self.mllog_path)
            run_start = run_start_ms(events)
            if run_start is None:
                raise CheckpointError(
                    f"cannot resume at step {newest}: {self.mllog_path} has no run_start"
                )
            self._ended = any(e.key == "block_stop" for e in events)
            self._log = TrainingLog(self.mllog_path, append=True)
        self._repair_manifest(complete, run_start)
        params, state, meta = self.saver.restore_train_state(newest, params_like, state_like)
        self._resumed = True
        self._last_step, self._last_update_ms = newest, meta.timestamp_ms
        return ResumePoint(
            step=newest,
            params=params,
            state=state,
            timestamp_ms=meta.timestamp_ms,
            finished=self._ended,
        )

    def _repair_manifest(self, complete: list[int], run_start: int | None) -> None:
        storage = storage_for(self.layout.manifest)
        rows = {}
        if storage.exists(self.layout.manifest):
            text = storage.read_text(self.layout.manifest)
            rows = {r.step: r for r in manifest.parse_rows(text, self.layout.manifest)}
        for step, row in rows.items():
            current = run_start is None or row.timestamp_ms >= run_start
            if current and step not in complete:
                raise CheckpointError(
                    f"step {step}: manifest row points at {self.saver.step_path(step)}, which is "
                    "not a complete checkpoint (deleted by hand?); refusing to resume over it"
                )
        for step in complete:
            meta = self.saver.read_meta(step)
            saved = SavedCheckpoint(step=step, path=self.saver.step_path(step), meta=meta)
            if rows.get(step) != self._row(saved):
                self._record_row(saved)

    # -- the training loop ----------------------------------------------------------------

    def on_init_start(self, time_ms: int | None = None) -> None:
        """Start the MLLOG afresh: cache_clear, init_start, submission keys, hyperparameters."""
        if self._resumed or not self.rcp_logging:
            return
        self._log = TrainingLog(self.mllog_path)
        self._log.training_header(
            self.hp, self.seed, self.system, self.train_samples,
            time_ms=now_ms() if time_ms is None else time_ms,
        )  # fmt: skip

    def on_run_start(self, time_ms: int | None = None) -> None:
        """``init_stop``, ``run_start`` and the training block's ``block_start``."""
        if self._resumed or not self.rcp_logging:
            return
        if self._log is None:
            raise RuntimeError("on_run_start() before on_init_start()")
        t = now_ms() if time_ms is None else time_ms
        self._log.init_stop(time_ms=t)
        self._log.run_start(time_ms=t)
        self._log.block_start(samples_count=0, step=0, time_ms=t)

    def after_update(self, step: int, params: PyTree, state: PyTree) -> int:
        """Call right after optimizer update number `step`; returns its timestamp_ms.

        Blocks until `params` are computed, takes the timestamp, then (from val_start_at on)
        copies `params` and `state` to host memory and queues their save; it waits for earlier
        saves only when `max_pending_saves` of them are unfinished. The trainer must not donate
        `params` or `state` before this returns; afterwards the save holds its own host copy.
        Raises `tpu_jobs.saver.SaveFailedError` if an earlier save failed (its step is named).
        """
        if self._ended:
            raise RuntimeError(f"step {step}: after_update() after on_train_end()")
        if self._last_step is not None and step != self._last_step + 1:
            raise ValueError(
                f"step {step}: expected step {self._last_step + 1} (steps are updates, 1 apart)"
            )
        if not 1 <= step <= self.hp.max_steps:
            raise ValueError(f"step {step}: outside 1..max_steps ({self.hp.max_steps})")
        jax.block_until_ready(params)
        timestamp_ms = now_ms()
        # Timestamps must strictly increase (manifest contract) and are in ms: two updates done
        # within one ms (a tiny model, now that saves no longer slow the loop) wait for the next
        # tick, so every timestamp stays a clock reading taken after its update completed.
        last = self._last_update_ms
        if last is not None and timestamp_ms < last - CLOCK_STEP_BACK_MS:
            raise RuntimeError(
                f"step {step}: the clock reads {timestamp_ms} ms, before step {self._last_step}'s "
                f"timestamp {last} ms (clock stepped back?); timestamps must increase"
            )
        while last is not None and timestamp_ms <= last:
            time.sleep(0.0002)
            timestamp_ms = now_ms()
        self._last_step, self._last_update_ms = step, timestamp_ms
        if step >= self.val_start_at:
            self.saver.save(step, params, state, timestamp_ms=timestamp_ms, extra=self._extra)
        return timestamp_ms

    def flush(self) -> None:
        """Block until every queued save has committed and has its row (e.g. before the trainer
        exits on a preemption notice); raises `SaveFailedError` if one failed."""
        self.saver.wait()

    def on_train_end(self) -> None:
        """Wait for the queued saves and their rows, then log ``block_stop`` backdated to the
        last weight update. Idempotent; a resumed run that had already ended logs nothing."""
        self.flush()
        self.saver.close()
        if self._ended:
            return
        self._ended = True
        if self._log is not None and self._last_step is not None:
            assert self._last_update_ms is not None
            self._log.block_stop(
                samples_count=self._last_step * self.hp.global_batch_size,
                step=self._last_step,
                time_ms=self._last_update_ms,
            )

    # -- error path -----------------------------------------------------------------------

    def __enter__(self) -> RcpHooks:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
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

    @property
    def last_update(self) -> tuple[int, int] | None:
        """(step, timestamp_ms) of the last weight update seen (or restored), if any."""
        if self._last_step is None or self._last_update_ms is None:
            return None
        return self._last_step, self._last_update_ms
