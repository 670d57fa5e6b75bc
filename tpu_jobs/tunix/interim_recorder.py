"""INTERIM stand-in for ``rcpflow.recorder.TrainingRecorder`` until that module lands on main.

Same duties and method names as the planned recorder: the MLLOG training section (header,
``init_stop``, ``run_start``, ``block_start``; at the end one ``block_stop`` backdated to the
last weight update), strictly increasing update timestamps, and one manifest row per committed
checkpoint (upserted by step, so a repeat writes the same row, never a second one). Built only on
rcpflow's public pieces (`rcpflow.mllog.TrainingLog`, `rcpflow.manifest.upsert`). When
``rcpflow/recorder.py`` is merged, `tpu_jobs.tunix.train` switches to it and this file goes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rcpflow import manifest, recipe
from rcpflow.layout import RunLayout
from rcpflow.mllog import SystemInfo, TrainingLog, read_events, run_start_ms
from rcpflow.storage import storage_for

CLOCK_STEP_BACK_MS = 1000


class RecorderError(RuntimeError):
    """The run's records disagree with what the trainer reports; the message names the step."""


@dataclass(frozen=True)
class Committed:
    """A checkpoint found committed on storage (what a resume rebuilds rows from)."""

    step: int
    checkpoint_path: str  # as the row records it (relative to the manifest's folder)
    timestamp_ms: int
    extra: Mapping[str, Any]


@dataclass(frozen=True)
class Resumed:
    step: int
    timestamp_ms: int
    ended: bool  # the log already has its block_stop


class TrainingRecorder:
    def __init__(
        self,
        run_dir: str,
        *,
        seed: int,
        hyperparameters: recipe.Hyperparameters,
        val_start_at: int,
        system: SystemInfo | None = None,
        rcp_logging: bool = True,
    ) -> None:
        hp = hyperparameters
        if not 1 <= val_start_at <= hp.max_steps:
            raise ValueError(f"val_start_at {val_start_at} must be in 1..{hp.max_steps}")
        self.layout = RunLayout(run_dir)
        self.seed = seed
        self.hp = hp
        self.val_start_at = val_start_at
        self.system = system if system is not None else SystemInfo()
        self.rcp_logging = rcp_logging
        self._log: TrainingLog | None = None
        self._resumed = False
        self._ended = False
        self._lock = threading.Lock()  # updates (loop) vs. rows (the commit watcher's thread)
        self._updates: dict[int, int] = {}
        self._last: tuple[int, int] | None = None

    @property
    def mllog_path(self) -> str:
        return self.layout.mllog(self.seed)

    def _row(self, step: int, path: str, timestamp_ms: int, extra: Mapping[str, Any]) -> Any:
        hp = self.hp
        return manifest.ManifestRow(
            step=step,
            checkpoint_path=path,
            timestamp_ms=timestamp_ms,
            samples_count=step * hp.global_batch_size,
            global_batch_size=hp.global_batch_size,
            batch_size=hp.num_prompts_per_step,
            num_generations=hp.num_generations_per_prompt,
            val_start_at=self.val_start_at,
            max_steps=hp.max_steps,
            target_accuracy=recipe.TARGET_ACCURACY,
            seed=self.seed,
            mllog_file=f"seed_{self.seed}.out",
            weights_fingerprint=extra["weights_fingerprint"],
        )

    def resume(self, committed: Sequence[Committed]) -> Resumed | None:
        """Continue a run from its newest committed checkpoint; None: nothing to continue."""
        kept = sorted((c for c in committed if c.step >= self.val_start_at), key=lambda c: c.step)
        if not kept:
            return None
        newest = kept[-1]
        run_start = None
        if self.rcp_logging:
            if not storage_for(self.mllog_path).exists(self.mllog_path):
                raise RecorderError(f"cannot resume at step {newest.step}: no {self.mllog_path}")
            events = read_events(self.mllog_path)
            run_start = run_start_ms(events)
            if run_start is None:
                raise RecorderError(f"cannot resume at step {newest.step}: no run_start logged")
            self._ended = any(e.key == "block_stop" for e in events)
            self._log = TrainingLog(self.mllog_path, append=True)
        storage = storage_for(self.layout.manifest)
        rows = {}
        if storage.exists(self.layout.manifest):
            text = storage.read_text(self.layout.manifest)
            rows = {r.step: r for r in manifest.parse_rows(text, self.layout.manifest)}
        steps = {c.step for c in kept}
        for step, row in rows.items():
            if (run_start is None or row.timestamp_ms >= run_start) and step not in steps:
                raise RecorderError(
                    f"step {step}: manifest row points at {row.checkpoint_path}, which is not a "
                    "committed checkpoint; refusing to resume over it"
                )
        for c in kept:
            row = self._row(c.step, c.checkpoint_path, c.timestamp_ms, c.extra)
            if rows.get(c.step) != row:
                manifest.upsert(self.layout.manifest, row)
            self._updates[c.step] = c.timestamp_ms
        self._resumed = True
        self._last = (newest.step, newest.timestamp_ms)
        return Resumed(step=newest.step, timestamp_ms=newest.timestamp_ms, ended=self._ended)

    def on_init_start(self, time_ms: int | None = None) -> None:
        if self._resumed or not self.rcp_logging:
            return
        self._log = TrainingLog(self.mllog_path)
        self._log.training_header(self.hp, self.seed, self.system,
                                  self.hp.max_steps * self.hp.global_batch_size,
                                  time_ms=_now_ms() if time_ms is None else time_ms)  # fmt: skip

    def on_run_start(self, time_ms: int | None = None) -> None:
        if self._resumed or not self.rcp_logging:
            return
        if self._log is None:
            raise RuntimeError("on_run_start() before on_init_start()")
        t = _now_ms() if time_ms is None else time_ms
        self._log.init_stop(time_ms=t)
        self._log.run_start(time_ms=t)
        self._log.block_start(samples_count=0, step=0, time_ms=t)

    def on_update(self, step: int, timestamp_ms: int) -> int:
        """Record update `step` done at `timestamp_ms` (moved 1 ms on when it ties the last)."""
        with self._lock:
            if self._ended:
                raise RuntimeError(f"step {step}: on_update() after on_train_end()")
            last = self._last
            if last is not None and step != last[0] + 1:
                raise RecorderError(f"step {step}: expected step {last[0] + 1}")
            if not 1 <= step <= self.hp.max_steps:
                raise RecorderError(f"step {step}: outside 1..{self.hp.max_steps}")
            if last is not None and timestamp_ms < last[1] - CLOCK_STEP_BACK_MS:
                raise RecorderError(f"step {step}: clock at {timestamp_ms} ms, before {last[1]}")
            if last is not None and timestamp_ms <= last[1]:
                timestamp_ms = last[1] + 1
            self._last = (step, timestamp_ms)
            self._updates[step] = timestamp_ms
            return timestamp_ms

    def on_checkpoint_committed(
        self, step: int, checkpoint_path: str, extra: Mapping[str, Any]
    ) -> manifest.ManifestRow:
        with self._lock:
            if step not in self._updates:
                raise RecorderError(f"step {step}: checkpoint committed for an unrecorded update")
            if step < self.val_start_at:
                raise RecorderError(f"step {step}: before val_start_at {self.val_start_at}")
            timestamp_ms = self._updates[step]
        row = self._row(step, checkpoint_path, timestamp_ms, extra)
        manifest.upsert(self.layout.manifest, row)
        return row

    def on_train_end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._log is not None and self._last is not None:
            step, t = self._last
            self._log.block_stop(
                samples_count=step * self.hp.global_batch_size, step=step, time_ms=t
            )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
