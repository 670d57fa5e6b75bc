"""The manifest of saved checkpoints: ``mllog/eval_checkpoints.jsonl``, one JSON row per step.

The trainer upserts a row once a checkpoint is fully written; the evaluation side loads and
validates the whole file before trusting any row. Validation errors name ``line N`` (a line that
is not a row) or ``step N`` (a row that breaks the contract).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rcpflow import recipe
from rcpflow.files import jsonio
from rcpflow.files.layout import dirname, join, mllog_name, normalized, resolve
from rcpflow.files.storage import read_if_present, storage_for
from rcpflow.files.usererrors import describe
from rcpflow.records.mllog import MLLogError, read_events, run_start_ms

log = logging.getLogger(__name__)


class ManifestError(ValueError):
    """The manifest breaks the contract; the message names the line or step."""


_INT_FIELDS = (
    "step",
    "timestamp_ms",
    "samples_count",
    "global_batch_size",
    "batch_size",
    "num_generations",
    "val_start_at",
    "max_steps",
    "seed",
)
# Counts and steps: zero or less is no run (steps count updates from 1); a seed may be 0.
_POSITIVE_FIELDS = tuple(name for name in _INT_FIELDS if name != "seed")
# Every row of one run must agree on these.
_RUN_FIELDS = (
    "global_batch_size",
    "batch_size",
    "num_generations",
    "val_start_at",
    "max_steps",
    "target_accuracy",
    "seed",
    "mllog_file",
)
# Names foreign trainers give the weight-update time (Tunix versions differ); `timestamp_ms` is
# the one written.
TIMESTAMP_ALIASES = ("weight_update_timestamp_ms", "checkpoint_timestamp_ms")


@dataclass(frozen=True)
class ManifestRow:
    """One saved checkpoint. `batch_size` is prompts per step (gbs / num_generations)."""

    step: int
    checkpoint_path: str
    timestamp_ms: int
    samples_count: int
    global_batch_size: int
    batch_size: int
    num_generations: int
    val_start_at: int
    max_steps: int
    target_accuracy: float
    seed: int
    mllog_file: str
    weights_fingerprint: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> ManifestRow:
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: a row must be a JSON object, got {type(d).__name__}")
        d = _canonical_timestamp(d, where)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ManifestError(f"{where}: unknown field(s) {', '.join(unknown)}")
        missing = sorted(
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in d and f.default is dataclasses.MISSING
        )
        if missing:
            raise ManifestError(f"{where}: missing field(s) {', '.join(missing)}")
        for name in _INT_FIELDS:
            if isinstance(d[name], bool) or not isinstance(d[name], int):
                raise ManifestError(f"{where}: {name} must be an integer, got {d[name]!r}")
        for name in _POSITIVE_FIELDS:
            if d[name] <= 0:
                raise ManifestError(f"{where}: {name} must be positive, got {d[name]!r}")
        if d["max_steps"] > recipe.MAX_STEPS_LIMIT:
            raise ManifestError(
                f"{where}: max_steps {d['max_steps']} is beyond {recipe.MAX_STEPS_LIMIT}"
            )
        problem = recipe.time_problem(d["timestamp_ms"])
        if problem is not None:
            raise ManifestError(f"{where}: timestamp_ms {problem}")
        for name in ("checkpoint_path", "mllog_file"):
            if not isinstance(d[name], str) or not d[name]:
                raise ManifestError(f"{where}: {name} must be a non-empty string")
        target = d["target_accuracy"]
        if isinstance(target, bool) or not isinstance(target, int | float) or not 0 <= target <= 1:
            raise ManifestError(f"{where}: target_accuracy must be a number in [0, 1]")
        if target != recipe.TARGET_ACCURACY:
            raise ManifestError(
                f"{where}: target_accuracy {target} is not the benchmark's {recipe.TARGET_ACCURACY}"
            )
        fp = d.get("weights_fingerprint")
        if fp is not None and not isinstance(fp, str):
            raise ManifestError(f"{where}: weights_fingerprint must be a string or null")
        return cls(**{**d, "target_accuracy": float(target)})


def _canonical_timestamp(d: dict[str, Any], where: str) -> dict[str, Any]:
    """`d` with the weight-update time under `timestamp_ms` only; names that disagree raise."""
    given = [(n, d[n]) for n in ("timestamp_ms", *TIMESTAMP_ALIASES) if n in d]
    if [n for n, _ in given] in ([], ["timestamp_ms"]):
        return d
    first_name, first = given[0]
    for name, value in given[1:]:
        if value != first or type(value) is not type(first):
            raise ManifestError(f"{where}: {first_name} {first!r} and {name} {value!r} disagree")
    return {**{k: v for k, v in d.items() if k not in TIMESTAMP_ALIASES}, "timestamp_ms": first}


@dataclass(frozen=True)
class Manifest:
    """Validated rows sorted by step, with paths resolved against the manifest's folder."""

    path: str
    rows: tuple[ManifestRow, ...]
    stale_steps: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()

    def row(self, step: int) -> ManifestRow:
        for r in self.rows:
            if r.step == step:
                return r
        raise ManifestError(f"step {step}: not in manifest {self.path}")


def parse_rows(text: str, where: str) -> list[ManifestRow]:
    """Rows in file order; a line that is not a row raises naming ``line N``."""
    rows = []
    for line_no, line in enumerate(text.split("\n"), start=1):  # JSON Lines: split on \n only
        if not line.strip():
            continue
        try:
            d = jsonio.loads(line, where, first_line=line_no)
        except jsonio.JSONInputError as e:
            raise ManifestError(str(e)) from e
        rows.append(ManifestRow.from_dict(d, where=f"{where}: line {line_no}"))
    return rows


def decode(data: bytes, where: str) -> str:
    try:
        return jsonio.decode_utf8(data, where)
    except jsonio.JSONInputError as e:
        raise ManifestError(str(e)) from e


def render_rows(rows: Sequence[ManifestRow]) -> bytes:
    return "".join(r.to_json() + "\n" for r in sorted(rows, key=lambda r: r.step)).encode()


def upsert(manifest_path: str, row: ManifestRow) -> None:
    """Insert or replace the row of ``row.step``, keeping the file sorted by step.

    Safe against a concurrent upsert (the storage's conditional update re-reads and retries).
    """

    def merge(old: bytes | None) -> bytes:
        rows = parse_rows(decode(old, manifest_path), manifest_path) if old else []
        return render_rows([r for r in rows if r.step != row.step] + [row])

    storage_for(manifest_path).update(manifest_path, merge)


def remove(manifest_path: str, step: int) -> None:
    """Drop the row of `step` if there is one (its checkpoint is gone and will be saved again)."""

    def without(old: bytes | None) -> bytes:
        rows = parse_rows(decode(old, manifest_path), manifest_path) if old else []
        return render_rows([r for r in rows if r.step != step])

    storage_for(manifest_path).update(manifest_path, without)


def read_rows(manifest_path: str) -> list[ManifestRow]:
    """The rows of the manifest as written (not resolved, not validated); [] if there is none.
    Raises ManifestError naming the line, also for bytes that are not UTF-8."""
    data = read_if_present(manifest_path)
    if data is None:
        return []
    return parse_rows(decode(data, manifest_path), manifest_path)


def _resolved(row: ManifestRow, base: str) -> ManifestRow:
    return dataclasses.replace(
        row,
        checkpoint_path=resolve(base, row.checkpoint_path),
        mllog_file=resolve(base, row.mllog_file),
    )


def _check_own_mllog(rows: Sequence[ManifestRow], base: str, where: str) -> None:
    """Every row must name this run's own MLLOG, ``seed_<seed>.out`` beside the manifest: a row
    pointing anywhere else would have finalize read and rewrite another run's log."""
    for r in rows:
        own = join(base, mllog_name(r.seed))
        if normalized(r.mllog_file) != normalized(own):
            raise ManifestError(
                f"{where}: step {r.step}: mllog_file resolves to {r.mllog_file}, not this run's "
                f"MLLOG {own}"
            )


def check_consistent(rows: Sequence[ManifestRow], where: str) -> None:
    """Rows that may belong to one run, in any order and not yet contiguous: one per step,
    agreeing on the run's fields, with samples_count = step x gbs and timestamps that increase
    with the step. Raises naming the step."""
    by_step: dict[int, ManifestRow] = {}
    for r in rows:
        if r.step in by_step:
            raise ManifestError(f"{where}: step {r.step}: appears more than once")
        by_step[r.step] = r
    ordered = sorted(rows, key=lambda r: r.step)
    if not ordered:
        return
    first = ordered[0]
    for r in ordered:
        for name in _RUN_FIELDS:
            if getattr(r, name) != getattr(first, name):
                raise ManifestError(
                    f"{where}: step {r.step}: {name} {getattr(r, name)!r} differs from "
                    f"{getattr(first, name)!r} (step {first.step})"
                )
        if r.samples_count != r.step * r.global_batch_size:
            raise ManifestError(
                f"{where}: step {r.step}: samples_count {r.samples_count} != step * "
                f"global_batch_size = {r.step * r.global_batch_size}"
            )
        if r.batch_size * r.num_generations != r.global_batch_size:
            raise ManifestError(
                f"{where}: step {r.step}: batch_size {r.batch_size} x num_generations "
                f"{r.num_generations} != global_batch_size {r.global_batch_size}"
            )
        if r.step > r.max_steps:
            raise ManifestError(f"{where}: step {r.step}: beyond max_steps {r.max_steps}")
        if r.step < r.val_start_at:
            raise ManifestError(
                f"{where}: step {r.step}: before val_start_at {r.val_start_at} (never evaluated)"
            )
    for prev, r in itertools.pairwise(ordered):
        if r.timestamp_ms <= prev.timestamp_ms:
            raise ManifestError(
                f"{where}: step {r.step}: timestamp_ms {r.timestamp_ms} is not after step "
                f"{prev.step}'s {prev.timestamp_ms}"
            )


def validate_rows(rows: Sequence[ManifestRow], where: str) -> None:
    """Contract checks on rows already free of stale ones; raises naming the step."""
    check_consistent(rows, where)
    ordered = sorted(rows, key=lambda r: r.step)
    if not ordered:
        return
    first = ordered[0]
    if first.step != first.val_start_at:
        raise ManifestError(
            f"{where}: step {first.step}: first checkpoint must be the validation start step "
            f"{first.val_start_at}"
        )
    for prev, r in itertools.pairwise(ordered):
        if r.step != prev.step + 1:
            raise ManifestError(f"{where}: {gap_message(prev.step, r.step)}")


def gap_message(before: int, after: int) -> str:
    """``steps 20 missing between 19 and 21`` (``steps 20..22`` for a longer gap)."""
    missing = f"{before + 1}" if after - before == 2 else f"{before + 1}..{after - 1}"
    return f"steps {missing} missing between {before} and {after} (steps must be contiguous)"


def load(manifest_path: str, mllog_path: str | None = None) -> Manifest:
    """Read and validate a manifest.

    Rows older than the MLLOG's ``run_start`` come from an earlier attempt: they are dropped
    with a warning. The MLLOG is `mllog_path`, else the rows' ``mllog_file``; if neither can be
    read the stale check is skipped with a warning.
    """
    if not manifest_path:
        raise ManifestError("the manifest path is empty")
    storage = storage_for(manifest_path)
    try:
        text = decode(storage.read_bytes(manifest_path), manifest_path)
    except FileNotFoundError as e:
        raise ManifestError(f"{manifest_path}: no manifest (no checkpoint was recorded)") from e
    except OSError as e:  # a folder where the file belongs, or no permission
        raise ManifestError(describe(e)) from e
    base = dirname(manifest_path)
    rows = [_resolved(r, base) for r in parse_rows(text, manifest_path)]
    _check_own_mllog(rows[:1], base, manifest_path)  # before the stale check reads it
    warnings: list[str] = []
    log_path = mllog_path or (rows[0].mllog_file if rows else None)
    stale: list[int] = []
    if log_path is not None:
        try:
            start = run_start_ms(read_events(log_path))
        except FileNotFoundError:
            start = None
            warnings.append(f"MLLOG {log_path} not found: stale rows not checked")
        except MLLogError as e:
            raise ManifestError(str(e)) from e
        except OSError as e:  # a folder where the log belongs, no permission
            raise ManifestError(describe(e)) from e
        if start is None and not warnings:
            warnings.append(f"MLLOG {log_path} has no run_start: stale rows not checked")
        if start is not None:
            for r in rows:
                if r.timestamp_ms < start:
                    stale.append(r.step)
                    warnings.append(
                        f"step {r.step}: timestamp_ms {r.timestamp_ms} is older than run_start "
                        f"{start} (an earlier attempt); dropped"
                    )
            rows = [r for r in rows if r.step not in stale]
    for w in warnings:
        log.warning("%s: %s", manifest_path, w)
    validate_rows(rows, manifest_path)
    _check_own_mllog(rows, base, manifest_path)
    return Manifest(
        path=manifest_path,
        rows=tuple(sorted(rows, key=lambda r: r.step)),
        stale_steps=tuple(stale),
        warnings=tuple(warnings),
    )
