"""`rcpflow retention plan|apply`: the retention rule (`rcpflow.retention.rule`) on a run folder.

`plan_run` reads the facts (the manifest, each summary once, the verdict from them, whether the
MLLOG's training has ended, which checkpoints hold a full state) and sizes what would go, by
listing (never reading checkpoint bytes; ``gs://`` listings are paged and streamed).
`apply_run` is an intent log, safe to rerun and to interrupt: it writes the plan to the run's
retention record (`RunLayout.retention`) before deleting anything, deletes, then marks it done; a
rerun finishes an unfinished apply first. Nothing written after the plan is deleted: each part
records its newest file time (local) or object generation (``gs://``); a newer one keeps the part,
and every ``gs://`` delete carries the listed generation as a precondition (sent in batches of
up to 100; an object a batch fails to delete is named in the record, the part kept), and a part
whose checkpoint an evaluation began to read since the plan (`rcpflow.records.evaluating`) is
kept. One apply per run folder at a time (`rcpflow.retention.lock`).

A foreign trainer's tree (NeMo-RL's ``step_<N>/``, Tunix's) outside the run's ``checkpoints/``
is deleted from only when the caller names it (`trees`: the deployment allows it); what goes is
decided as for rcpflow's own, from the run's manifest rows and their verified summaries only,
never from the trainer's own files.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass

from rcpflow.files.layout import CHECKPOINT_STATE_DIR, RunLayout, is_gcs, normalized
from rcpflow.files.storage import (
    GCS_BATCH_LIMIT,
    delete_generations,
    gcs_objects,
    read_if_present,
    storage_for,
)
from rcpflow.records.checkpoint_state import run_snapshot
from rcpflow.records.evaluating import running
from rcpflow.records.manifest import ManifestError, load
from rcpflow.retention.lock import holding
from rcpflow.retention.rule import (
    DEFAULT_POLICY,
    CheckpointFacts,
    Decision,
    Evaluation,
    RetentionPolicy,
    RunFacts,
)
from rcpflow.retention.rule import decide as decide_retention
from rcpflow.verdict.finalize import FinalizeInputError, decide
from rcpflow.verdict.gate import passes
from rcpflow.verdict.verify import evaluate_step, reading_once

RECORD_FORMAT = 1
# Objects per page of a gs:// listing: memory per call is bounded by it, not by the checkpoint.
PAGE_SIZE = 1000
# gs:// deletes per batch request (tests make it 1 to interleave a rewrite between deletes).
BATCH_SIZE = GCS_BATCH_LIMIT
# The objects a part's failed deletes name in the record, at most (their count is recorded too).
MAX_FAILED_RECORDED = 100


class RetentionError(ValueError):
    """The run folder cannot be planned (no usable manifest, a summary that cannot be read);
    the message names it."""


@dataclass(frozen=True)
class Planned:
    """A decision with what its part holds now: files/objects, bytes, and the newest file time
    (ns) or object generation (nothing newer is deleted)."""

    decision: Decision
    files: int
    bytes: int
    newest: int


@dataclass(frozen=True)
class Entry:
    """A file or object of a part: its path, size and time (ns) or generation."""

    path: str
    size: int
    stamp: int


def inside(path: str, tree: str) -> bool:
    """Whether `path` lies inside `tree` (whole names), reached without following a link:
    locally neither the path nor a folder on the way below `tree` may be a symlink."""
    if is_gcs(path) != is_gcs(tree):
        return False
    p, t = normalized(path).rstrip("/"), normalized(tree).rstrip("/")
    if not p.startswith(t + "/"):
        return False
    if is_gcs(path):
        return True
    here = t
    for name in p[len(t) + 1 :].split("/"):
        here = os.path.join(here, name)
        if os.path.islink(here):
            return False
    return os.path.realpath(p).startswith(os.path.realpath(t) + os.sep)


def _local_entries(root: str) -> Iterator[Entry]:
    """Files under `root` (links as themselves, never followed), by lstat: no bytes read."""
    if os.path.islink(root) or os.path.isfile(root):
        st = os.lstat(root)
        yield Entry(root, st.st_size, st.st_mtime_ns)
        return
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            yield Entry(path, st.st_size, st.st_mtime_ns)


def _gcs_entries(root: str) -> Iterator[Entry]:
    """Objects under the folder `root`, page by page (never the whole listing at once)."""
    for path, size, generation in gcs_objects(root, PAGE_SIZE):
        yield Entry(path, size, generation)


def entries(root: str) -> Iterator[Entry]:
    return _gcs_entries(root) if is_gcs(root) else _local_entries(root)


def _present(path: str) -> bool:
    if is_gcs(path):
        return next(iter(_gcs_entries(path)), None) is not None
    return os.path.lexists(path)


def _full_state(path: str) -> bool:
    return CHECKPOINT_STATE_DIR in storage_for(path).subfolders(path)


def in_trees(path: str, layout: RunLayout, trees: Sequence[str]) -> bool:
    """Whether `path` lies inside the run's checkpoint tree or one of the named `trees`."""
    return any(inside(path, t) for t in (layout.checkpoints_dir, *trees))


def run_facts(run_dir: str, settled: bool = False, trees: Sequence[str] = ()) -> RunFacts:
    """The facts the rule decides from, each summary read once; `trees`: foreign trainers'
    checkpoint trees where deletes are allowed besides the run's own."""
    layout = RunLayout(run_dir)
    try:
        manifest = load(layout.manifest)
    except ManifestError as e:
        raise RetentionError(f"{layout.root}: no usable manifest: {e}") from e
    rows = manifest.rows
    if not rows:
        return RunFacts((), None, False, False)
    snapshot = run_snapshot(layout.root, rows[0].seed)
    with reading_once():
        found = {row.step: evaluate_step(layout.root, row) for row in rows}
        try:
            verdict = decide(layout.root, rows, found)
        except FinalizeInputError as e:
            raise RetentionError(f"{layout.root}: {e}") from e
    checkpoints = []
    for row in rows:
        f = found[row.step]
        evaluation: Evaluation = "missing" if f.state == "missing" else "unusable"
        if f.valid and f.summary is not None:
            evaluation = "passes" if passes(f.summary, row) else "below"
        path = row.checkpoint_path
        ok = in_trees(path, layout, trees)
        present = ok and _present(path)
        full = present and _full_state(path)
        now = running(layout.root, row.step) if present else None
        why = "; ".join(f.problems) if evaluation == "unusable" else ""
        checkpoints.append(CheckpointFacts(row.step, path, ok, present, evaluation, full, now, why))
    passing = verdict.end_row.step if verdict.status == "success" and verdict.end_row else None
    # The passing checkpoint (the one the MLLOG's run_stop names) is kept by the policy, so
    # that --keep nothing may let it go; `protected` is for what the run folder cannot tell.
    return RunFacts(
        tuple(checkpoints),
        passing,
        verdict.status in ("success", "aborted"),
        snapshot.ended_at is not None,
        settled=settled,
    )


def _sized(d: Decision) -> Planned:
    files = size = newest = 0
    if d.goes:
        for e in entries(d.path):
            files, size, newest = files + 1, size + e.size, max(newest, e.stamp)
    return Planned(d, files, size, newest)


def plan_run(
    run_dir: str,
    policy: RetentionPolicy = DEFAULT_POLICY,
    settled: bool = False,
    trees: Sequence[str] = (),
) -> list[Planned]:
    """What the rule decides for the run now, each part that goes with its size; `settled`:
    no evaluation of the run is running or will start (`RunFacts.settled`); `trees`: foreign
    checkpoint trees where deletes are allowed (`run_facts`)."""
    decisions = decide_retention(run_facts(run_dir, settled, trees), policy)
    return [_sized(d) for d in decisions]


# Called after each file or object is deleted (tests interrupt an apply here).
AfterDelete = Callable[[str], None]
after_delete: AfterDelete | None = None


def _now_ms() -> int:
    return int(time.time() * 1000)


def read_record(run_dir: str) -> dict[str, object] | None:
    """The run's retention record, if an apply ever ran."""
    path = RunLayout(run_dir).retention
    data = read_if_present(path)
    if data is None:
        return None
    try:
        record = json.loads(data)
    except ValueError as e:
        raise RetentionError(f"{path}: not a retention record: {e}") from e
    if not isinstance(record, dict) or not isinstance(record.get("applies"), list):
        raise RetentionError(f"{path}: not a retention record (no applies list)")
    for n, applied in enumerate(record["applies"], start=1):
        parts = applied.get("parts") if isinstance(applied, dict) else None
        if not isinstance(parts, list) or not all(_part_ok(p) for p in parts):
            raise RetentionError(f"{path}: apply {n}: not a list of parts as apply writes them")
    return record


# A recorded part's fields and their JSON types (`_planned_json`).
_PART_FIELDS = {"step": int, "part": str, "path": str, "goes": bool, "reason": str, "newest": int}


def _part_ok(part: object) -> bool:
    return isinstance(part, dict) and all(
        isinstance(part.get(k), t) for k, t in _PART_FIELDS.items()
    )


def _write_record(run_dir: str, record: dict[str, object]) -> None:
    path = RunLayout(run_dir).retention
    storage_for(path).write_atomic(path, (json.dumps(record, indent=2) + "\n").encode())


def _planned_json(p: Planned) -> dict[str, object]:
    return {**asdict(p.decision), "files": p.files, "bytes": p.bytes, "newest": p.newest}


def _delete_gcs(path: str, newest: int, failed: list[str]) -> str | None:
    """Delete the gs:// part at `path` in batches of BATCH_SIZE, each object only at its listed
    generation; why the part was kept, else None. An object a batch could not delete (neither
    deleted, gone nor rewritten) is appended to `failed` as ``path: HTTP status``."""
    rewritten: list[str] = []
    pending: list[Entry] = []

    def flush() -> None:
        statuses = delete_generations([(e.path, e.stamp) for e in pending])
        for e, status in zip(pending, statuses, strict=True):
            if status == 412:
                rewritten.append(e.path)
            elif 200 <= status < 300 or status == 404:  # 404: gone already, as wanted
                if after_delete is not None:
                    after_delete(e.path)
            else:
                failed.append(f"{e.path}: HTTP {status}")
        pending.clear()

    for e in entries(path):
        if e.stamp > newest:
            return f"changed since the plan ({e.path} is newer): kept"
        pending.append(e)
        if len(pending) >= BATCH_SIZE:
            flush()
            if rewritten:  # no further batch: the part changed under the plan
                break
    if pending and not rewritten:
        flush()
    if rewritten:
        return f"changed since the plan ({rewritten[0]} was rewritten): kept"
    if failed:
        more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
        return f"not deleted: {failed[0]}{more} (see failed; a rerun tries again)"
    return None


def _delete_part(path: str, newest: int, failed: list[str]) -> str | None:
    """Delete the part at `path`, nothing newer than `newest`; why a part was kept, else None
    (`failed`: the gs:// objects a batch could not delete)."""
    # A first pass (streamed) so that a part written since the plan is left whole, not half
    # deleted; the second pass deletes, each gs:// object only at its listed generation.
    for e in entries(path):
        if e.stamp > newest:
            return f"changed since the plan ({e.path} is newer): kept"
    if is_gcs(path):
        return _delete_gcs(path, newest, failed)
    for e in entries(path):
        if e.stamp > newest:
            return f"changed since the plan ({e.path} is newer): kept"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(e.path)
        if after_delete is not None:
            after_delete(e.path)
    if os.path.isdir(path) and not os.path.islink(path):
        for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):  # not empty: something was kept
                os.rmdir(dirpath)
    return None


def apply_run(
    run_dir: str,
    policy: RetentionPolicy = DEFAULT_POLICY,
    settled: bool = False,
    trees: Sequence[str] = (),
    patience_s: float = 0.0,
) -> dict[str, object]:
    """Finish an unfinished apply, else plan, record the intent, delete, mark done; the apply
    as recorded. An unfinished apply keeps the trees it was planned with. One apply per run
    folder at a time (`rcpflow.retention.lock`): RetentionBusy when another holds it
    (longer than `patience_s`)."""
    root = RunLayout(run_dir).root
    if not is_gcs(root) and not os.path.isdir(root):
        raise RetentionError(f"{root}: no run folder")
    with holding(run_dir, patience_s):
        return _apply_held(run_dir, policy, settled, trees)


def _apply_held(
    run_dir: str, policy: RetentionPolicy, settled: bool, trees: Sequence[str]
) -> dict[str, object]:
    record = read_record(run_dir) or {"format": RECORD_FORMAT, "applies": []}
    applies = record["applies"]
    assert isinstance(applies, list)
    if applies and applies[-1].get("done_ms") is None:
        current = applies[-1]
    else:
        current = {
            "started_ms": _now_ms(),
            "done_ms": None,
            "policy": asdict(policy),
            "settled": settled,
            "trees": list(trees),
            "parts": [_planned_json(p) for p in plan_run(run_dir, policy, settled, trees)],
        }
        applies.append(current)
        _write_record(run_dir, record)  # the intent, before anything is deleted
    layout = RunLayout(run_dir)
    planned_trees = current.get("trees", [])
    if not isinstance(planned_trees, list) or not all(isinstance(t, str) for t in planned_trees):
        raise RetentionError(f"{layout.retention}: trees is not a list of paths")
    for part in current["parts"]:
        if not part["goes"] or part.get("outcome"):
            continue
        now = running(layout.root, part["step"])
        if not in_trees(part["path"], layout, planned_trees):  # the record is not trusted blindly
            part["outcome"] = "outside the run's checkpoint tree: kept"
        elif now is not None:  # an evaluation began after the plan
            part["outcome"] = f"being evaluated since the plan ({now}): kept"
        else:
            failed: list[str] = []
            part["outcome"] = _delete_part(part["path"], part["newest"], failed) or "deleted"
            if failed:
                part["failed"] = failed[:MAX_FAILED_RECORDED]
                part["failed_count"] = len(failed)
        part["outcome_ms"] = _now_ms()
        _write_record(run_dir, record)
    current["done_ms"] = _now_ms()
    _write_record(run_dir, record)
    return dict(current)


@dataclass(frozen=True)
class RetentionNote:
    """What the retention record says of one part: kept (why), gone (why, when) or kept because
    it changed or left the tree after the plan."""

    step: int
    part: str
    state: str  # kept | gone
    reason: str
    when_ms: int | None  # gone: when it was deleted


def retention_notes(run_dir: str) -> list[RetentionNote]:
    """Per part, what the applies recorded (a part deleted once stays gone; else the latest
    apply's decision), by step; [] when no apply ran. Reads the record only, no summary."""
    record = read_record(run_dir)
    if record is None:
        return []
    notes: dict[tuple[int, str], RetentionNote] = {}
    for applied in record["applies"]:  # type: ignore[attr-defined]
        for p in applied.get("parts", ()):
            key = (p["step"], p["part"])
            if key in notes and notes[key].state == "gone":
                continue
            outcome = p.get("outcome")
            if outcome == "deleted":
                note = RetentionNote(*key, "gone", p["reason"], p.get("outcome_ms"))
            elif outcome:
                note = RetentionNote(*key, "kept", outcome, None)
            elif p["goes"]:
                note = RetentionNote(*key, "kept", "planned to go; the apply did not finish", None)
            else:
                note = RetentionNote(*key, "kept", p["reason"], None)
            notes[key] = note
    return sorted(notes.values(), key=lambda n: (n.step, n.part))
