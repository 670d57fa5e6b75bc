"""`rcpflow run reset`: move a run's MLLOG aside so that a trainer may start the folder afresh.

A trainer never rewrites a finished run's log (`TrainingRecorder.on_init_start` refuses). To
train the folder again from step 1, the user says so: the logs ``mllog/seed_<n>.out``, the
manifest and the stop request move to ``previous/reset-<UTC time>/`` (kept, never deleted). The
old run's summaries stay: they no longer match any new row and are evaluated again. Refused
while another live trainer owns the folder. Checkpoints are not touched: delete them first, or
the trainer resumes from them.
"""

from __future__ import annotations

import re
import time

from rcpflow.files.layout import MANIFEST_NAME, MLLOG_DIR, RunLayout, join
from rcpflow.files.storage import storage_for
from rcpflow.trainer import ownership

_LOG_NAME = re.compile(r"seed_\d+\.out")


class ResetError(ValueError):
    """Nothing to reset, or the folder is owned; the message names it."""


def _moved(parts: list[str]) -> bool:
    """A log or the manifest directly in ``mllog/`` (`parts`: the path's last three parts)."""
    name = parts[-1]
    return parts[-2] == MLLOG_DIR and (name == MANIFEST_NAME or bool(_LOG_NAME.fullmatch(name)))


def reset_run(run_dir: str, now_s: float | None = None) -> tuple[str, tuple[str, ...]]:
    """Move the run's log, manifest and stop request aside; returns (folder, moved paths)."""
    layout = RunLayout(run_dir)
    try:
        ownership.refuse_if_live(layout, "a reset")
    except ownership.RunOwnedError as e:
        raise ResetError(str(e)) from e
    storage = storage_for(layout.mllog_dir)
    logs = [p for p in storage.list(layout.mllog_dir) if _moved(p.rsplit("/", 2))]
    sources = [*logs, *([layout.stop_request] if storage.exists(layout.stop_request) else [])]
    if not logs:
        raise ResetError(f"{layout.mllog_dir}: no MLLOG or manifest to move aside")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now_s is None else now_s))
    folder = join(layout.root, "previous", f"reset-{stamp}")
    if storage.list(folder):
        raise ResetError(f"{folder}: already exists; reset again in a second")
    moved = []
    for source in sources:
        relative = source[len(layout.root) + 1 :]
        target = join(folder, relative)
        storage.write_atomic(target, storage.read_bytes(source))
        storage.delete(source)
        moved.append(target)
    return folder, tuple(moved)
