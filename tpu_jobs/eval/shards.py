"""Sharded evaluation: which instances a worker owns, its shard file, and worker 0's gathering.

Worker k of N evaluates the instances i with i % N == k and writes them, in one atomic write, to
``attempts/shard_<k>-of-<N>.jsonl``: a JSON header (identity, shard index, fatal error, record
count, times) then the records. A file belongs to this evaluation only if its identity matches
(`EvalIdentity`: the launch's attempt id, the checkpoint, the sampling settings, N); any other is
stale, ignored with a word, and worker 0 waits for the live worker to overwrite it. Clearing the
folder at start could delete a faster worker's shard, and matching on the checkpoint alone would
merge an earlier attempt's transient error into a retry. Pure Python on `rcpflow.files.storage`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rcpflow.files.layout import join
from rcpflow.files.storage import storage_for

SLICE_INDEX_ENV = "RCPFLOW_SLICE_INDEX"
NUM_SLICES_ENV = "RCPFLOW_NUM_SLICES"
ATTEMPT_ID_ENV = "RCPFLOW_ATTEMPT_ID"

HEADER_KIND = "rcpflow.eval_shard"
SHARD_FORMAT = 1
STATUSES = ("resolved", "failed", "error")
# Polling storage: often enough that worker 0 finishes soon after the last shard lands, rarely
# enough that 15 pollers-worth of GCS list calls stay negligible.
POLL_S = 2.0
PROGRESS_EVERY_S = 60.0
# Worker 0's wait for the other shards, after its own; below the deployment's 30-minute watch of
# an eval JobSet, so the incomplete summary is written before Airflow gives up on the job.
DEFAULT_SHARD_TIMEOUT_S = 20 * 60.0

Record = dict[str, Any]


class ShardingError(ValueError):
    """Bad shard settings; the message names the flag (and the variable a default came from)."""


class ShardError(ValueError):
    """A shard file of this evaluation that cannot be merged; the message names file and line."""


@dataclass(frozen=True)
class Sharding:
    """This worker's place in the evaluation: shard `index` of `count`, launch `attempt_id`;
    worker 0 waits `timeout_s` for the other shards after its own."""

    index: int
    count: int
    attempt_id: str = ""
    timeout_s: float = DEFAULT_SHARD_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ShardingError(f"shard {self.index} of {self.count} is not a valid shard")

    @property
    def coordinator(self) -> bool:
        """Worker 0 gathers the shards and writes the summary."""
        return self.index == 0

    def instances(self, total: int) -> list[int]:
        """The instance indices this worker evaluates: i % count == index."""
        return list(range(self.index, total, self.count))


SINGLE = Sharding(index=0, count=1)


def _from_env(flag: str, env: str, environ: Mapping[str, str]) -> tuple[int | None, str]:
    raw = environ.get(env)
    if raw is None:
        return None, flag
    where = f"{flag} (from {env}={raw!r})"
    try:
        return int(raw.strip()), where
    except ValueError:
        raise ShardingError(f"{where}: not an integer") from None


def resolve_sharding(
    index: int | None,
    count: int | None,
    attempt_id: str | None,
    environ: Mapping[str, str],
) -> Sharding:
    """The sharding from the flags, each defaulting to its environment variable, then to shard
    0 of 1. A flag given explicitly wins over the variable. With more than one shard the index
    and the attempt id must come from somewhere: a defaulted index 0 on every pod would make
    every worker the coordinator."""
    count_where, index_where = "--num-shards", "--shard-index"
    if count is None:
        count, count_where = _from_env("--num-shards", NUM_SLICES_ENV, environ)
    if index is None:
        index, index_where = _from_env("--shard-index", SLICE_INDEX_ENV, environ)
    if count is None:
        count = 1
    if count < 1:
        raise ShardingError(f"{count_where}: the number of shards must be >= 1, got {count}")
    if index is None:
        if count > 1:
            raise ShardingError(
                f"--shard-index: not given and {SLICE_INDEX_ENV} is not set, but there are "
                f"{count} shards ({count_where}); every worker needs its own index"
            )
        index = 0
    if not 0 <= index < count:
        raise ShardingError(
            f"{index_where}: shard index {index} is out of range 0..{count - 1} for {count} "
            f"shard(s) ({count_where})"
        )
    if attempt_id is None:
        attempt_id = environ.get(ATTEMPT_ID_ENV, "")
    if count > 1 and not attempt_id.strip():
        raise ShardingError(
            f"--attempt-id: needed with {count} shards (and {ATTEMPT_ID_ENV} is not set): every "
            "worker of one evaluation passes the same id, so that worker 0 can tell this "
            "attempt's shard files from those an earlier attempt left"
        )
    return Sharding(index=index, count=count, attempt_id=attempt_id)


@dataclass(frozen=True)
class EvalIdentity:
    """What makes two shard files parts of the same evaluation (see the module docstring)."""

    attempt_id: str
    num_shards: int
    checkpoint_path: str
    step: int | None
    timestamp_ms: int | None
    weights_fingerprint: str | None
    instances: int
    attempts_per_instance: int
    sampling: Mapping[str, Any]  # sampling settings that change the attempts (seed, top_p, ...)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SHARD_FORMAT,
            "attempt_id": self.attempt_id,
            "num_shards": self.num_shards,
            "checkpoint_path": self.checkpoint_path,
            "step": self.step,
            "timestamp_ms": self.timestamp_ms,
            "weights_fingerprint": self.weights_fingerprint,
            "instances": self.instances,
            "attempts_per_instance": self.attempts_per_instance,
            "sampling": dict(self.sampling),
        }

    def differences(self, other: Any) -> list[str]:
        """How a header's identity (JSON) differs from this one; empty when it is the same."""
        if not isinstance(other, dict):
            return [f"identity is {type(other).__name__}, not an object"]
        ours = self.to_json()
        # Through JSON, so that e.g. tuples and lists or 1 and 1.0 compare as they are stored.
        ours = json.loads(json.dumps(ours))
        return [
            f"{key} {other.get(key)!r} != {ours.get(key)!r}"
            for key in sorted(set(ours) | set(other))
            if other.get(key) != ours.get(key)
        ]


@dataclass(frozen=True)
class Shard:
    """One worker's part of this evaluation, as read back (or as computed, for worker 0)."""

    index: int
    path: str
    fatal_error: str | None
    start_ms: int
    records: tuple[Record, ...]


@dataclass(frozen=True)
class Stale:
    """A shard file that is not part of this evaluation, and why."""

    path: str
    reason: str


def shard_path(attempts_dir: str, index: int, count: int) -> str:
    return join(attempts_dir, f"shard_{index}-of-{count}.jsonl")


def write_shard(attempts_dir: str, identity: EvalIdentity, shard: Shard) -> str:
    """Write `shard` (records sorted by instance, attempt) in one atomic write; return its path."""
    path = shard_path(attempts_dir, shard.index, identity.num_shards)
    header = {
        "kind": HEADER_KIND,
        "identity": identity.to_json(),
        "shard_index": shard.index,
        "fatal_error": shard.fatal_error,
        "records": len(shard.records),
        "start_ms": shard.start_ms,
        "written_ms": time.time_ns() // 1_000_000,
    }
    records = sorted(shard.records, key=lambda r: (r["instance"], r["attempt"]))
    lines = [json.dumps(header, sort_keys=True)]
    lines += [json.dumps(r, sort_keys=True) for r in records]
    storage_for(path).write_atomic(path, ("\n".join(lines) + "\n").encode())
    return path


def read_shard(path: str, identity: EvalIdentity, index: int) -> Shard | Stale:
    """Shard `index` of the evaluation `identity` from `path`, or `Stale` when the file belongs to
    another evaluation. Raises ShardError when the file claims to be this evaluation's but its
    records do not add up (wrong instances, duplicates, a missing record)."""
    lines = storage_for(path).read_text(path).splitlines()
    try:
        header = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError as e:
        return Stale(path, f"line 1 is not a shard header ({e.msg})")
    if not isinstance(header, dict) or header.get("kind") != HEADER_KIND:
        return Stale(path, "line 1 is not a shard header")
    differences = identity.differences(header.get("identity"))
    if header.get("shard_index") != index:
        differences.append(f"shard_index {header.get('shard_index')!r} != {index}")
    if differences:
        return Stale(path, "; ".join(differences))
    fatal = header.get("fatal_error")
    start_ms = header.get("start_ms")
    if not (fatal is None or isinstance(fatal, str)) or not isinstance(start_ms, int):
        raise ShardError(f"{path}: line 1: malformed header (fatal_error, start_ms)")
    if header.get("records") != len(lines) - 1:
        raise ShardError(
            f"{path}: header says {header.get('records')!r} records, the file has {len(lines) - 1}"
        )
    owned = Sharding(index, identity.num_shards).instances(identity.instances)
    expected = {(i, a) for i in owned for a in range(identity.attempts_per_instance)}
    records = [_record(path, n, line, expected) for n, line in enumerate(lines[1:], start=2)]
    seen = {(r["instance"], r["attempt"]) for r in records}
    if len(seen) != len(records):
        raise ShardError(f"{path}: an (instance, attempt) appears twice")
    if fatal is None and seen != expected:
        lacking = sorted(expected - seen)
        raise ShardError(
            f"{path}: {len(lacking)} of {len(expected)} attempts missing, e.g. "
            f"(instance, attempt) {lacking[0]}"
        )
    if fatal is not None and records:
        raise ShardError(f"{path}: a shard with a fatal error must hold no records")
    return Shard(
        index=index, path=path, fatal_error=fatal, start_ms=start_ms, records=tuple(records)
    )


def _record(path: str, line_no: int, line: str, expected: set[tuple[int, int]]) -> Record:
    where = f"{path}: line {line_no}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ShardError(f"{where}: not JSON ({e.msg})") from e
    if not isinstance(record, dict):
        raise ShardError(f"{where}: an attempt record must be a JSON object")
    for key, kind in (("instance", int), ("attempt", int), ("status", str)):
        if not isinstance(record.get(key), kind) or isinstance(record.get(key), bool):
            raise ShardError(f"{where}: {key} must be {kind.__name__}, got {record.get(key)!r}")
    reward = record.get("reward")
    if not isinstance(reward, int | float) or isinstance(reward, bool):
        raise ShardError(f"{where}: reward must be a number, got {reward!r}")
    if record["status"] not in STATUSES:
        raise ShardError(f"{where}: status {record['status']!r} is not one of {STATUSES}")
    if (record["instance"], record["attempt"]) not in expected:
        raise ShardError(
            f"{where}: instance {record['instance']} attempt {record['attempt']} does not "
            "belong to this shard"
        )
    return record


@dataclass(frozen=True)
class Gathered:
    """What worker 0 has when it stops waiting: the shards of this evaluation it found (its own
    included), and those still missing."""

    shards: dict[int, Shard]
    missing: tuple[int, ...]

    @property
    def fatal(self) -> Shard | None:
        """The lowest-index shard that carries a fatal error, if any."""
        return next(
            (self.shards[k] for k in sorted(self.shards) if self.shards[k].fatal_error), None
        )


def gather_shards(
    attempts_dir: str,
    identity: EvalIdentity,
    own: Shard,
    *,
    timeout_s: float,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Gathered:
    """Poll `attempts_dir` until every shard of `identity` is there, one carries a fatal error
    (nothing else can change the verdict), or `timeout_s` has passed. `own` (worker 0's shard)
    is taken as given. Raises ShardError for a shard of this evaluation that cannot be merged."""
    count = identity.num_shards
    shards = {own.index: own}
    stale_said: dict[int, str] = {}
    deadline = clock() + timeout_s
    poll_s = min(POLL_S, max(0.05, timeout_s / 20))
    next_progress = clock() + PROGRESS_EVERY_S
    while True:
        pending = [k for k in range(count) if k not in shards]
        present = set(storage_for(attempts_dir).list(attempts_dir)) if pending else set()
        for k in pending:
            path = shard_path(attempts_dir, k, count)
            if path not in present:
                continue
            try:
                got = read_shard(path, identity, k)
            except FileNotFoundError:
                continue  # replaced between the listing and the read: next poll
            if isinstance(got, Stale):
                if stale_said.get(k) != got.reason:
                    log(f"ignoring {path}: not this evaluation's shard ({got.reason})")
                    stale_said[k] = got.reason
                continue
            shards[k] = got
            what = f"fatal error: {got.fatal_error}" if got.fatal_error else (
                f"{len(got.records)} attempts"
            )  # fmt: skip
            log(f"shard {k} of {count}: {what}")
        result = Gathered(shards=shards, missing=tuple(k for k in range(count) if k not in shards))
        if not result.missing or result.fatal is not None or clock() >= deadline:
            return result
        if clock() >= next_progress:
            log(f"still waiting for shard(s) {list(result.missing)} of {count}")
            next_progress = clock() + PROGRESS_EVERY_S
        sleep(poll_s)


def merge_records(shards: Sequence[Shard]) -> list[Record]:
    """All records of `shards`, sorted by (instance, attempt): the same list however the
    instances were split."""
    records = [r for shard in shards for r in shard.records]
    return sorted(records, key=lambda r: (r["instance"], r["attempt"]))
