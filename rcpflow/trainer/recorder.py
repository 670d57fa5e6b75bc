"""The trainer recorder: what any trainer calls to leave a compliant ``qwen35_397b_grpo`` run.

It owns the training section of the MLLOG and one manifest row per committed checkpoint, for a
trainer that saves its own checkpoints; it never sees parameters. Call order: `resume()` (None:
a fresh run), `on_init_start()`, `on_run_start()`, per step `on_update(step)` once the update
completed, `on_checkpoint_committed(step, path)` once saved (any thread, any order) and
`stop_requested()`, last `on_train_end()`. Why and how resume works: docs/design.md (recorder).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

from rcpflow import recipe
from rcpflow.files.layout import RunLayout, join, mllog_name
from rcpflow.files.storage import StorageError, storage_for
from rcpflow.files.usererrors import refused_as
from rcpflow.records import manifest
from rcpflow.records.manifest import ManifestError, ManifestRow
from rcpflow.records.mllog import Event, SystemInfo, TrainingLog, read_events, run_start_ms
from rcpflow.trainer import ownership
from rcpflow.verdict import stop_request

log = logging.getLogger(__name__)

# A clock behind the previous update's timestamp by more than this is an error, not a wait.
CLOCK_STEP_BACK_MS = 1000
# Optional row fields a trainer may add (the manifest's schema is closed).
ROW_EXTRA_FIELDS = frozenset({"weights_fingerprint"})


class RecorderError(RuntimeError):
    """The call would break the run's contract; the message names the step and the reason."""


class RunFolderError(RecorderError, StorageError):
    """The run folder is not this trainer's to write: another live owner holds it, or its log
    has ended (a finished run). A StorageError too, so the jobs report it as one line and exit
    1 (a run folder that cannot be used as it is)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Resumed:
    """Where a resumed run stands."""

    step: int | None  # last step with a committed checkpoint row; None: none yet
    timestamp_ms: int | None  # that step's weight-update time
    finished: bool  # the log already has its block_stop: only on_train_end() may follow


def checkpoint_present(path: str) -> bool:
    """A file, or a folder with something in it (on GCS a folder is a prefix)."""
    storage = storage_for(path)
    return storage.exists(path) or bool(storage.list(path))


def _row_path(root: str, path: str) -> str:
    """Relative to the manifest's folder when inside the run, so the folder can be copied."""
    if path.startswith(root.rstrip("/") + "/"):
        return join("..", path[len(root.rstrip("/")) + 1 :])
    return path


def check_new_row(
    rows: Sequence[ManifestRow], row: ManifestRow, run_start: int | None, where: str
) -> None:
    """`row` may join `rows` (the run's current ones): not before run_start, consistent with
    them (`manifest.check_consistent`). Contiguity is not asked here: rows may commit in any
    order (a saver thread each); a hole that stays is refused at the end and by the loader."""
    if run_start is not None and row.timestamp_ms < run_start:
        raise RecorderError(
            f"{where}: step {row.step}: timestamp_ms {row.timestamp_ms} is before run_start "
            f"{run_start}"
        )
    with refused_as(RecorderError, ManifestError):
        manifest.check_consistent([*(r for r in rows if r.step != row.step), row], where)


def build_row(
    root: str,
    step: int,
    checkpoint_path: str,
    timestamp_ms: int,
    *,
    seed: int,
    global_batch_size: int,
    num_generations: int,
    val_start_at: int,
    max_steps: int,
    target_accuracy: float,
    extra: Mapping[str, object],
) -> ManifestRow:
    unknown = sorted(set(extra) - ROW_EXTRA_FIELDS)
    if unknown:
        raise RecorderError(
            f"step {step}: extra field(s) {', '.join(unknown)} are not manifest fields "
            f"(allowed: {', '.join(sorted(ROW_EXTRA_FIELDS))})"
        )
    with refused_as(RecorderError, ManifestError):
        return ManifestRow.from_dict(
            {
                "step": step,
                "checkpoint_path": _row_path(root, checkpoint_path),
                "timestamp_ms": timestamp_ms,
                "samples_count": step * global_batch_size,
                "global_batch_size": global_batch_size,
                "batch_size": global_batch_size // num_generations,
                "num_generations": num_generations,
                "val_start_at": val_start_at,
                "max_steps": max_steps,
                "target_accuracy": target_accuracy,
                "seed": seed,
                "mllog_file": mllog_name(seed),
                **extra,
            },
            where=f"step {step}",
        )


def current_rows(manifest_path: str, run_start: int | None) -> list[ManifestRow]:
    rows = manifest.read_rows(manifest_path)  # non-UTF-8 bytes: a ManifestError naming the line
    return [r for r in rows if run_start is None or r.timestamp_ms >= run_start]


def header_value(events: Sequence[Event], key: str, where: str) -> object:
    found = [e.value for e in events if e.key == key]
    if not found:
        raise RecorderError(f"{where}: no {key} event (not a training log?)")
    return found[0]


class TrainingRecorder:
    """One run's recorder; see the module docstring for the call order."""

    def __init__(
        self,
        run_dir: str,
        *,
        seed: int,
        hyperparameters: recipe.Hyperparameters,
        val_start_at: int,
        system: SystemInfo | None = None,
        rcp_logging: bool = True,
        train_samples: int | None = None,
        target_accuracy: float = recipe.TARGET_ACCURACY,
        owner: str | None = None,
        lease_timeout_s: float | None = None,
    ) -> None:
        """`owner`: this trainer's identity for the run folder's lease (default
        `rcpflow.trainer.ownership.owner_from_env`: a retry of the same orchestrator task is the
        same owner); `lease_timeout_s`: after how long without a heartbeat the lease is stale."""
        hp = hyperparameters
        if target_accuracy != recipe.TARGET_ACCURACY:
            raise ValueError(
                f"target_accuracy {target_accuracy} is not the benchmark's {recipe.TARGET_ACCURACY}"
            )
        if not 1 <= val_start_at <= hp.max_steps:
            raise ValueError(
                f"val_start_at {val_start_at} must be in 1..max_steps ({hp.max_steps}): no "
                "checkpoint would ever be evaluated"
            )
        self.layout = RunLayout(run_dir)
        self.seed = seed
        self.hp = hp
        self.val_start_at = val_start_at
        self.system = system if system is not None else SystemInfo()
        self.rcp_logging = rcp_logging
        self.train_samples = (
            hp.max_steps * hp.global_batch_size if train_samples is None else train_samples
        )
        self.target_accuracy = target_accuracy
        self._lock = threading.Lock()
        self._log: TrainingLog | None = None
        self._resumed = False
        self._ended = False
        self._run_start: int | None = None
        self._last_step: int | None = None
        self._last_update_ms: int | None = None
        self._update_ms: dict[int, int] = {}  # step -> weight-update time, from val_start_at
        self._committed: dict[int, ManifestRow] = {}
        self._lease = ownership.Lease(
            self.layout.root,
            owner if owner is not None else ownership.owner_from_env(),
            ownership.timeout_from_env() if lease_timeout_s is None else lease_timeout_s,
        )
        self._owned = False

    def _own(self) -> None:
        """Take the run folder's lease (once) and keep its heartbeat; RunFolderError naming the
        owner when another live trainer holds it."""
        with self._lock:
            if self._owned:
                return
            try:
                said = self._lease.acquire()
            except ownership.RunOwnedError as e:
                raise RunFolderError(str(e)) from e
            if said:
                log.warning("%s: %s", self._lease.path, said)
            self._lease.start_heartbeat()
            self._owned = True

    def _check_still_owned(self, step: int) -> None:
        lost = self._lease.lost
        if lost is not None:
            raise RunFolderError(f"step {step}: this trainer lost the run folder: {lost}")

    def _confirm_lease(self, step: int) -> None:
        """Read the lease again (a heartbeat) before a write into the folder: a trainer whose
        lease was taken over, or whose folder was removed, writes nothing more."""
        if self._owned:
            self._lease.refresh()
        self._check_still_owned(step)

    def _refuse_an_ended_log(self) -> None:
        """A finished run's MLLOG is never started afresh: its training section ended."""
        path = self.mllog_path
        try:
            events = read_events(path)
        except FileNotFoundError:
            return
        start = run_start_ms(events)
        ended = [
            e
            for e in events
            if e.key in ("block_stop", "run_stop") and (start is None or e.time_ms >= start)
        ]
        if start is not None and ended:
            raise RunFolderError(
                f"{path}: the run has ended ({ended[-1].key} at line {ended[-1].line_no}); a "
                "trainer never rewrites a finished run's log. To train this folder again from "
                f"the start, move the old log aside: rcpflow run reset {self.layout.root}"
            )

    @property
    def mllog_path(self) -> str:
        return self.layout.mllog(self.seed)

    @property
    def last_update(self) -> tuple[int, int] | None:
        """(step, timestamp_ms) of the last weight update seen (or resumed from), if any."""
        with self._lock:
            if self._last_step is None or self._last_update_ms is None:
                return None
            return self._last_step, self._last_update_ms

    def row(
        self,
        step: int,
        checkpoint_path: str,
        timestamp_ms: int,
        extra: Mapping[str, object] | None = None,
    ) -> ManifestRow:
        """The manifest row this run records for `step`."""
        return build_row(
            self.layout.root, step, checkpoint_path, timestamp_ms,
            seed=self.seed, global_batch_size=self.hp.global_batch_size,
            num_generations=self.hp.num_generations_per_prompt, val_start_at=self.val_start_at,
            max_steps=self.hp.max_steps, target_accuracy=self.target_accuracy, extra=extra or {},
        )  # fmt: skip

    # -- resume -----------------------------------------------------------------------------

    def resume(self) -> Resumed | None:
        """Continue a run whose log or manifest exists; None for a fresh run. Call before
        `on_init_start`. The log's header and every current row must be this run's."""
        self._own()
        log_exists = storage_for(self.mllog_path).exists(self.mllog_path)
        rows_exist = storage_for(self.layout.manifest).exists(self.layout.manifest)
        if not log_exists and not rows_exist:
            return None
        where = self.mllog_path
        run_start: int | None = None
        events: list[Event] = []
        if self.rcp_logging:
            if not log_exists:
                raise RecorderError(
                    f"cannot resume: {self.layout.manifest} exists but the run's MLLOG {where} "
                    "does not"
                )
            events = read_events(self.mllog_path)
            run_start = run_start_ms(events)
            if run_start is None:
                raise RecorderError(f"cannot resume: {where} has no run_start (start afresh?)")
            for key, want in (
                ("seed", self.seed),
                ("global_batch_size", self.hp.global_batch_size),
                ("max_steps", self.hp.max_steps),
                ("submission_division", self.hp.division),
            ):
                got = header_value(events, key, where)
                if got != want:
                    raise RecorderError(
                        f"cannot resume: {where} logs {key} {got!r}, this run has {want!r}"
                    )
        rows = sorted(current_rows(self.layout.manifest, run_start), key=lambda r: r.step)
        try:
            manifest.validate_rows(rows, self.layout.manifest)
        except ManifestError as e:
            raise RecorderError(f"cannot resume: {e}") from e
        for r in rows:
            if r != self.row(r.step, r.checkpoint_path, r.timestamp_ms, _extra_of(r)):
                raise RecorderError(
                    f"cannot resume: {self.layout.manifest}: step {r.step}: the row is not this "
                    f"run's (seed {self.seed}, val_start_at {self.val_start_at}): {r}"
                )
        stops = [e for e in events if e.key == "block_stop"]
        with self._lock:
            self._log = TrainingLog(self.mllog_path, append=True) if self.rcp_logging else None
            self._resumed = True
            self._ended = bool(stops)
            # Without a log the rows' own clock stands in for run_start (none is before it).
            self._run_start = (
                run_start
                if run_start is not None
                else min((r.timestamp_ms for r in rows), default=0)
            )
            self._committed = {r.step: r for r in rows}
            if rows:
                self._last_step, self._last_update_ms = rows[-1].step, rows[-1].timestamp_ms
                self._update_ms = {r.step: r.timestamp_ms for r in rows}
            return Resumed(
                step=rows[-1].step if rows else None,
                timestamp_ms=rows[-1].timestamp_ms if rows else None,
                finished=bool(stops),
            )

    def row_without_checkpoint(self, complete: Container[int]) -> int | None:
        """Right after `resume`: the first step whose current row (they run on from
        val_start_at) is not among the trainer's `complete` checkpoints; None when all are."""
        with self._lock:
            last = max(self._committed, default=self.val_start_at - 1)
        return next((s for s in range(self.val_start_at, last + 1) if s not in complete), None)

    # -- the training loop ------------------------------------------------------------------

    def on_init_start(self, time_ms: int | None = None) -> None:
        """Start the MLLOG afresh: cache_clear, init_start, submission keys, hyperparameters.
        Refused (RunFolderError) in a folder another trainer owns, or whose log has ended."""
        self._own()
        if self._resumed or not self.rcp_logging:
            return
        self._refuse_an_ended_log()
        self._log = TrainingLog(self.mllog_path)
        self._log.training_header(
            self.hp, self.seed, self.system, self.train_samples,
            time_ms=now_ms() if time_ms is None else time_ms,
        )  # fmt: skip

    def on_run_start(self, time_ms: int | None = None) -> None:
        """``init_stop``, ``run_start`` and the training block's ``block_start``."""
        self._own()
        if self._resumed:
            return
        t = now_ms() if time_ms is None else time_ms
        self._run_start = t
        if not self.rcp_logging:
            return
        if self._log is None:
            raise RecorderError("on_run_start() before on_init_start()")
        self._log.init_stop(time_ms=t)
        self._log.run_start(time_ms=t)
        self._log.block_start(samples_count=0, step=0, time_ms=t)

    def on_update(self, step: int, timestamp_ms: int | None = None) -> int:
        """Weight update number `step` has completed; returns its timestamp_ms.

        `timestamp_ms` is the trainer's own reading, taken after the update completed (None:
        now). Steps and timestamps strictly increase; with None, two updates within one ms wait
        for the next tick rather than share a timestamp.
        """
        self._check_still_owned(step)
        with self._lock:
            if self._ended:
                raise RecorderError(f"step {step}: on_update() after on_train_end()")
            if self._run_start is None:
                raise RecorderError(f"step {step}: on_update() before on_run_start()")
            if not 1 <= step <= self.hp.max_steps:
                raise RecorderError(f"step {step}: outside 1..max_steps ({self.hp.max_steps})")
            last, last_step = self._last_update_ms, self._last_step
            if last_step is not None and step <= last_step:
                raise RecorderError(f"step {step}: not after the last update, step {last_step}")
            if timestamp_ms is None:
                t = now_ms()
                if last is not None and t < last - CLOCK_STEP_BACK_MS:
                    raise RecorderError(
                        f"step {step}: the clock reads {t} ms, before step {last_step}'s "
                        f"timestamp {last} ms (clock stepped back?)"
                    )
                while last is not None and t <= last:
                    time.sleep(0.0002)
                    t = now_ms()
            else:
                t = timestamp_ms
                if last is not None and t <= last:
                    raise RecorderError(
                        f"step {step}: timestamp_ms {t} is not after step {last_step}'s {last}"
                    )
            if t < self._run_start:
                raise RecorderError(
                    f"step {step}: timestamp_ms {t} is before run_start {self._run_start}"
                )
            self._last_step, self._last_update_ms = step, t
            if step >= self.val_start_at:
                self._update_ms[step] = t
            return t

    def on_checkpoint_committed(
        self, step: int, checkpoint_path: str, extra: Mapping[str, object] | None = None
    ) -> ManifestRow:
        """Upsert the manifest row of `step`, whose checkpoint has committed at
        `checkpoint_path`, with the weight-update time recorded for it. Thread-safe: rows may
        commit in any order; the file stays sorted by step."""
        if step < self.val_start_at:
            raise RecorderError(
                f"step {step}: before val_start_at {self.val_start_at}: no row (never evaluated)"
            )
        with self._lock:
            ts = self._update_ms.get(step)
            if ts is None:
                raise RecorderError(f"step {step}: no on_update() for it: no weight-update time")
            row = self.row(step, checkpoint_path, ts, extra)
            done = self._committed.get(step)
            if done is not None:
                if done != row:
                    raise RecorderError(f"step {step}: already recorded as {done}")
                return done
        if not checkpoint_present(checkpoint_path):
            raise RecorderError(f"step {step}: no checkpoint at {checkpoint_path}")
        self._confirm_lease(step)  # a trainer that lost its lease writes no row
        with self._lock:
            check_new_row(
                list(self._committed.values()), row, self._run_start, self.layout.manifest
            )
            self._committed[step] = row
        manifest.upsert(self.layout.manifest, row)
        return row

    def stop_requested(self) -> bool:
        """Has the orchestrator asked this run to stop, its verdict being decided? Call after
        each step; if True, end with `on_train_end` (block_stop at the last update). Only a
        request that names this run and a checkpoint this recorder committed (same step and
        weight-update time) counts; without one this costs one existence check."""
        with self._lock:
            identity = stop_request.RunIdentity(
                seed=self.seed,
                global_batch_size=self.hp.global_batch_size,
                val_start_at=self.val_start_at,
                max_steps=self.hp.max_steps,
                run_start_ms=self._run_start if self.rcp_logging else None,
            )
            committed = dict(self._committed)
        request = stop_request.for_run(self.layout.root, identity)
        if request is None:
            return False
        row = committed.get(request.step)
        return row is not None and row.timestamp_ms == request.timestamp_ms

    def on_train_end(self) -> None:
        """``block_stop`` backdated to the last weight update, then the run folder's lease is
        released. Idempotent; a resumed run that had already ended logs nothing. Refuses when
        committed rows leave a hole."""
        self._end()
        self._lease.release()

    def _end(self) -> None:
        with self._lock:
            if self._ended:
                return
        if self._log is not None and self._last_step is not None:
            self._confirm_lease(self._last_step)  # no block_stop into another owner's run
        with self._lock:
            if self._ended:
                return
            steps = sorted(self._committed)
            if steps:
                holes = sorted(set(range(self.val_start_at, steps[-1] + 1)) - set(steps))
                if holes:
                    raise RecorderError(
                        f"steps {', '.join(map(str, holes))} have no committed checkpoint row "
                        f"below step {steps[-1]}: the manifest would have a gap"
                    )
            self._ended = True
            if self._log is not None and self._last_step is not None:
                assert self._last_update_ms is not None
                self._log.block_stop(
                    samples_count=self._last_step * self.hp.global_batch_size,
                    step=self._last_step,
                    time_ms=self._last_update_ms,
                )


def _extra_of(row: ManifestRow) -> dict[str, object]:
    return (
        {} if row.weights_fingerprint is None else {"weights_fingerprint": row.weights_fingerprint}
    )
