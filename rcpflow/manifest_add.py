"""`rcpflow manifest add`: one manifest row from outside a trainer, checked like the recorder's.

The run's fields (seed, batch, generations, max_steps) come from its MLLOG, `val_start_at` from
the other rows; the row must be the next step, after run_start and not after the log's
``block_stop``, with its checkpoint present. The identical row again is no error (a retry).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence

from rcpflow import manifest, recipe
from rcpflow.layout import RunLayout, is_gcs
from rcpflow.manifest import ManifestRow
from rcpflow.mllog import Event, read_events, run_start_ms
from rcpflow.recorder import (
    RecorderError,
    build_row,
    check_new_row,
    checkpoint_present,
    current_rows,
    header_value,
)
from rcpflow.storage import storage_for


def header_int(events: Sequence[Event], key: str, where: str) -> int:
    value = header_value(events, key, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecorderError(f"{where}: {key} {value!r} is not an integer")
    return value


def find_mllog(run_dir: str) -> str:
    """The run's only ``mllog/seed_<n>.out`` (local runs; on GCS give the seed)."""
    layout = RunLayout(run_dir)
    if is_gcs(layout.root):
        found = storage_for(layout.mllog_dir).list(layout.mllog_dir)
    else:
        found = glob.glob(os.path.join(layout.mllog_dir, "seed_*.out"))
    logs = sorted(p for p in found if re.fullmatch(r"seed_\d+\.out", p.rsplit("/", 1)[-1]))
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
    target_accuracy: float = recipe.TARGET_ACCURACY,
    weights_fingerprint: str | None = None,
) -> tuple[ManifestRow, bool]:
    """Record one committed checkpoint with the run's fields read from its MLLOG (`val_start_at`
    from the other rows, else the argument, else the recipe's). The step must be the next one
    (the first: val_start_at), its timestamp after the previous row's and run_start and not after
    the log's block_stop, its checkpoint present. Returns (row, added): the identical row already
    there is no error (a retried command), a different one is."""
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
    rows = sorted(current_rows(layout.manifest, run_start), key=lambda r: r.step)
    start = rows[0].val_start_at if rows else val_start_at
    if start is None:
        start = recipe.val_start_at(header["global_batch_size"])
    if val_start_at is not None and val_start_at != start:
        raise RecorderError(f"val_start_at {val_start_at} differs from the manifest's {start}")
    extra = {} if weights_fingerprint is None else {"weights_fingerprint": weights_fingerprint}
    row = build_row(
        layout.root, step, checkpoint_path, timestamp_ms,
        seed=header["seed"], global_batch_size=header["global_batch_size"],
        num_generations=header["num_generations_per_prompt"], val_start_at=start,
        max_steps=header["max_steps"], target_accuracy=target_accuracy, extra=extra,
    )  # fmt: skip
    old = {r.step: r for r in rows}.get(step)
    if old is not None:
        if old != row:
            raise RecorderError(f"step {step}: already recorded as {old}")
        return old, False
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
    stops = [e for e in events if e.key == "block_stop"]
    if stops and timestamp_ms > stops[-1].time_ms:
        raise RecorderError(
            f"step {step}: timestamp_ms {timestamp_ms} is after the log's block_stop "
            f"{stops[-1].time_ms} (the last weight update)"
        )
    if not checkpoint_present(checkpoint_path):
        raise RecorderError(f"step {step}: no checkpoint at {checkpoint_path}")
    check_new_row(rows, row, run_start, layout.manifest)
    manifest.upsert(layout.manifest, row)
    return row, True
