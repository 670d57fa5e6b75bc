"""`rcpflow manifest add`: one manifest row from outside a trainer, checked like the recorder's.

The run's fields (seed, batch, generations, max_steps) come from its MLLOG, `val_start_at` from
the other rows; the row must be the next step, after run_start and not after the log's
``block_stop``, with its checkpoint present. The check and the write are one step under the
manifest's lock; the identical row again is no error (a retry). A relative checkpoint path is
the caller's (current directory), recorded so that it resolves from ``mllog/``.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping, Sequence

from rcpflow import recipe
from rcpflow.files.layout import RunLayout, is_gcs
from rcpflow.files.storage import storage_for
from rcpflow.records import manifest
from rcpflow.records.manifest import ManifestError, ManifestRow
from rcpflow.records.mllog import Event, read_events, run_start_ms
from rcpflow.trainer import ownership
from rcpflow.trainer.recorder import (
    RecorderError,
    build_row,
    check_new_row,
    checkpoint_present,
    header_value,
)


def header_int(events: Sequence[Event], key: str, where: str) -> int:
    value = header_value(events, key, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecorderError(f"{where}: {key} {value!r} is not an integer")
    return value


_LOG_NAME = re.compile(r"seed_(0|[1-9][0-9]*)\.out")


def seed_index(log_path: str) -> int:
    """The run's seed index: the N of the ``seed_<N>.out`` read. The row's ``seed`` is this, not
    the ``seed`` the log states: NeMo-RL's launcher draws that at random (2115446333 and the
    like), and a row naming ``seed_<logged>.out`` would send finalize to a log that is not there."""
    m = _LOG_NAME.fullmatch(log_path.rsplit("/", 1)[-1])
    if m is None:
        raise RecorderError(f"{log_path}: not an MLLOG name seed_<n>.out")
    return int(m.group(1))


def find_mllog(run_dir: str) -> str:
    """The run's only ``mllog/seed_<n>.out`` (local runs; on GCS give the seed)."""
    layout = RunLayout(run_dir)
    if is_gcs(layout.root):
        found = storage_for(layout.mllog_dir).list(layout.mllog_dir)
    else:
        found = glob.glob(os.path.join(layout.mllog_dir, "seed_*.out"))
    logs = sorted(p for p in found if _LOG_NAME.fullmatch(p.rsplit("/", 1)[-1]))
    if len(logs) != 1:
        raise RecorderError(
            f"{layout.mllog_dir}: {len(logs)} logs seed_<n>.out; give --seed to pick one"
        )
    return logs[0]


def add_row(
    run_dir: str,
    step: int,
    checkpoint_path: str,
    timestamp_ms: int,
    *,
    seed: int | None = None,
    val_start_at: int | None = None,
    weights_fingerprint: str | None = None,
    owner: str | None = None,
) -> tuple[ManifestRow, bool]:
    """Record one committed checkpoint with the run's fields read from its MLLOG (`val_start_at`
    from the other rows, else the argument, else the recipe's). The step must be the next one
    (the first: val_start_at), its timestamp after the previous row's and run_start and not after
    the log's block_stop, its checkpoint present; checked and written under the manifest's lock.
    The run must not be owned by another (`rcpflow.trainer.ownership`; with `owner` the add takes or
    refreshes the lease as that owner). Returns (row, added): the identical row already there
    is no error (a retried command), a different one is."""
    layout = RunLayout(run_dir)
    log_path = layout.mllog(seed) if seed is not None else find_mllog(run_dir)
    if not storage_for(log_path).exists(log_path):
        raise RecorderError(f"{log_path}: no MLLOG (the trainer writes it first)")
    events = read_events(log_path)
    run_start = run_start_ms(events)
    if run_start is None:
        raise RecorderError(f"{log_path}: no run_start: training has not started")
    header = {
        k: header_int(events, k, log_path)
        for k in ("seed", "global_batch_size", "num_generations_per_prompt", "max_steps")
    }
    header["seed"] = seed_index(log_path)  # the log's own seed stays in the log
    checkpoint_path = as_given(checkpoint_path)
    if not checkpoint_present(checkpoint_path):
        raise RecorderError(f"step {step}: no checkpoint at {checkpoint_path}")
    stops = [e for e in events if e.key == "block_stop"]
    if stops and timestamp_ms > stops[-1].time_ms:
        raise RecorderError(
            f"step {step}: timestamp_ms {timestamp_ms} is after the log's block_stop "
            f"{stops[-1].time_ms} (the last weight update)"
        )
    ownership.check_or_refresh(layout, owner)
    extra = {} if weights_fingerprint is None else {"weights_fingerprint": weights_fingerprint}
    result: list[tuple[ManifestRow, bool]] = []

    def check_and_upsert(old: bytes | None) -> bytes:
        """Under the manifest's lock (a generation precondition on GCS): what the row is checked
        against is what it joins, so concurrent adds never lose a row."""
        result.clear()
        text = manifest.decode(old, layout.manifest) if old else ""
        every = manifest.parse_rows(text, layout.manifest)
        rows = sorted((r for r in every if r.timestamp_ms >= run_start), key=lambda r: r.step)
        row = _next_row(
            layout.root, rows, step, checkpoint_path, timestamp_ms, val_start_at, header, extra
        )
        old_row = {r.step: r for r in rows}.get(step)
        if old_row is not None:
            result.append((old_row, False))
            raise _Unchanged
        check_new_row(rows, row, run_start, layout.manifest)
        result.append((row, True))
        return manifest.render_rows([r for r in every if r.step != row.step] + [row])

    try:
        storage_for(layout.manifest).update(layout.manifest, check_and_upsert)
    except _Unchanged:
        pass
    except ManifestError as e:
        raise RecorderError(str(e)) from e
    return result[0]


class _Unchanged(Exception):
    """The identical row is there already: nothing to write."""


def as_given(path: str) -> str:
    """A local relative path is the user's, relative to the current directory: made absolute
    once, so the row (relative to ``mllog/`` inside the run, else absolute) resolves to it."""
    return path if is_gcs(path) or os.path.isabs(path) else os.path.abspath(path)


def _next_row(
    root: str,
    rows: Sequence[ManifestRow],
    step: int,
    checkpoint_path: str,
    timestamp_ms: int,
    val_start_at: int | None,
    header: dict[str, int],
    extra: Mapping[str, object],
) -> ManifestRow:
    """The row of `step` given the run's current `rows`; RecorderError unless it is the next
    one or the identical row is there."""
    start = rows[0].val_start_at if rows else val_start_at
    if start is None:
        start = recipe.val_start_at(header["global_batch_size"])
    if val_start_at is not None and val_start_at != start:
        raise RecorderError(f"val_start_at {val_start_at} differs from the manifest's {start}")
    row = build_row(
        root, step, checkpoint_path, timestamp_ms,
        seed=header["seed"], global_batch_size=header["global_batch_size"],
        num_generations=header["num_generations_per_prompt"], val_start_at=start,
        max_steps=header["max_steps"], target_accuracy=recipe.TARGET_ACCURACY, extra=extra,
    )  # fmt: skip
    old = {r.step: r for r in rows}.get(step)
    if old is not None:
        if old != row:
            raise RecorderError(f"step {step}: already recorded as {old}")
        return old
    want = rows[-1].step + 1 if rows else start
    if step != want:
        if not rows:
            raise RecorderError(
                f"step {step}: the first row is the validation start step {start}; add it first"
            )
        if step > want:
            raise RecorderError(
                f"step {step}: {manifest.gap_message(want - 1, step)}; add step {want} first"
            )
        raise RecorderError(f"step {step}: the next row is step {want}")
    return row
