"""One checkpoint's evaluation across its shards, for any trainer's `CheckpointLoader`.

One shard writes the attempts, then the summary (the commit point). With N shards each worker
writes its shard file (`tpu_jobs.eval.shards`); worker 0 then waits up to a timeout for the
others and merges them. Nothing raises: a restore, fingerprint or evaluation error (any shard's)
becomes the summary's ``fatal_error``, and a shard missing at the timeout leaves its attempts
missing; either summary is never valid, so the run can never end on it. A worker of several
processes (one `jax.distributed` system) evaluates its shard on all of them; a failure on any
is a failure on all, and process 0 alone writes.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass

import jax

from rcpflow import recipe
from rcpflow.files.layout import join
from rcpflow.files.storage import storage_for
from rcpflow.records.summary import AttemptResult, EvalSummary, build_summary, write_summary
from rcpflow.trainer.job_exit import EXIT_SIGTERM
from tpu_jobs.eval.attempts import sampling_settings
from tpu_jobs.eval.shards import (
    SINGLE,
    EvalIdentity,
    Gathered,
    Record,
    Shard,
    ShardError,
    Sharding,
    gather_shards,
    merge_records,
    write_shard,
)
from tpu_jobs.eval.target import CheckpointFacts, CheckpointLoader, Target, checked_facts
from tpu_jobs.rcp import collectives, termination

ATTEMPTS_FILE = "attempts.jsonl"
OTHER_PROCESS_FAILED = "another process of this worker failed (its error line says why)"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Outcome:
    """What one worker did: worker 0 (or the only worker) has the summary; the others only
    wrote their shard. `follower`: a process other than 0 of its worker, which wrote nothing."""

    summary: EvalSummary | None
    own_fatal_error: str | None
    missing_shards: tuple[int, ...] = ()
    shard_path: str | None = None
    follower: bool = False


def _identity(target: Target, sharding: Sharding, batch_rows: int) -> EvalIdentity:
    return EvalIdentity(
        attempt_id=sharding.attempt_id,
        num_shards=sharding.count,
        checkpoint_path=target.checkpoint_path,
        step=target.step,
        timestamp_ms=target.timestamp_ms,
        weights_fingerprint=target.expected_fingerprint,
        instances=recipe.EVAL_SAMPLES,
        attempts_per_instance=recipe.EVAL_ATTEMPTS_PER_INSTANCE,
        sampling=sampling_settings(batch_rows),
    )


def _evaluate_shard(
    target: Target, loader: CheckpointLoader, sharding: Sharding, start_ms: int
) -> tuple[Shard, CheckpointFacts]:
    """Restore, verify, sample this worker's instances. Any failure becomes the shard's
    `fatal_error` (with no records) instead of an exception."""
    facts = CheckpointFacts.of_target(target)
    records: list[Record] = []
    fatal: str | None = None
    try:
        loaded = loader.load(target.checkpoint_path, target.expected_fingerprint)
        facts = checked_facts(target, loaded.facts)
        records = loaded.attempts(sharding.instances(recipe.EVAL_SAMPLES))
    except Exception as e:
        if termination.received():  # a SIGTERM some library wrapped: no summary, exit 143
            raise termination.Terminated(EXIT_SIGTERM) from e
        fatal = f"{type(e).__name__}: {e}"
        records = []
    # The worker's processes agree: one that failed alone would leave no valid shard anyway.
    [failed] = collectives.any_process([fatal is not None])
    if failed and fatal is None:
        fatal, records = OTHER_PROCESS_FAILED, []
    shard = Shard(
        index=sharding.index, path="", fatal_error=fatal, start_ms=start_ms, records=tuple(records)
    )
    return shard, facts


def evaluate(
    target: Target,
    loader: CheckpointLoader,
    sharding: Sharding = SINGLE,
) -> Outcome:
    """Evaluate this worker's share of `target`. One shard: write attempts then the summary
    (the commit point). Several: write this worker's shard; worker 0 then gathers the others
    and writes the merged attempts and the summary. Failures end in a summary with
    `fatal_error` (written too), not in an exception."""
    start = now_ms()
    identity = _identity(target, sharding, loader.batch_rows)
    own, facts = _evaluate_shard(target, loader, sharding, start)
    if jax.process_index() != 0:
        return Outcome(summary=None, own_fatal_error=own.fatal_error, follower=True)
    if sharding.count == 1:
        gathered = Gathered(shards={0: own}, missing=())
    else:
        path = write_shard(target.attempts_dir, identity, own)
        own = dataclasses.replace(own, path=path)
        if not sharding.coordinator:
            return Outcome(summary=None, own_fatal_error=own.fatal_error, shard_path=path)
        gathered = Gathered(shards={0: own}, missing=())
        if own.fatal_error is None:  # a fatal error of its own decides; no need to wait
            try:
                gathered = gather_shards(
                    target.attempts_dir, identity, own, timeout_s=sharding.timeout_s
                )
            except ShardError as e:
                gathered = Gathered(
                    shards={0: dataclasses.replace(own, fatal_error=f"ShardError: {e}")},
                    missing=(),
                )
    fatal_shard = gathered.fatal
    fatal: str | None = None
    if fatal_shard is not None:
        fatal = fatal_shard.fatal_error
        if sharding.count > 1 and fatal_shard.index != 0:
            fatal = f"shard {fatal_shard.index} of {sharding.count}: {fatal}"
    records = [] if fatal else merge_records([gathered.shards[k] for k in sorted(gathered.shards)])
    if fatal is None:
        try:
            body = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
            path = join(target.attempts_dir, ATTEMPTS_FILE)
            storage_for(path).write_atomic(path, body.encode())
        except Exception as e:
            fatal, records = f"{type(e).__name__}: {e}", []
    attempts: list[list[AttemptResult]] = [[] for _ in range(recipe.EVAL_SAMPLES)]
    for r in records:
        attempts[r["instance"]].append(AttemptResult(status=r["status"], reward=float(r["reward"])))
    summary = build_summary(
        attempts,
        checkpoint=facts,
        target_accuracy=target.target_accuracy,
        # The evaluation began when its first worker did (pods start at different times).
        eval_start_ms=min(s.start_ms for s in gathered.shards.values()),
        eval_stop_ms=now_ms(),
        fatal_error=fatal,
    )
    write_summary(target.summary_path, summary)
    return Outcome(
        summary=summary,
        own_fatal_error=own.fatal_error,
        missing_shards=gathered.missing if fatal is None else (),
        shard_path=own.path or None,
    )
