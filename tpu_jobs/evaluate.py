"""The evaluator (``python -m tpu_jobs.evaluate``): pass@4 of one checkpoint on 251 instances.

Two modes:

    python -m tpu_jobs.evaluate --run-dir D --step N
        evaluates the checkpoint of manifest row N and writes D/eval/step_N/summary.json plus
        D/eval/step_N/attempts/attempts.jsonl (one record per attempt). A valid summary already
        there is reused (said on stdout), not recomputed.
    python -m tpu_jobs.evaluate --checkpoint PATH --output-dir OUT [--rcp-logging]
        evaluates one checkpoint folder without a manifest; OUT/summary.json, OUT/attempts/, and
        with --rcp-logging an MLLOG with the eval events in OUT/mllog/eval.out.

Each instance gets 4 attempts sampled at the validation temperature 0.1 and top_p 0.95 from the
UNSCANNED eval model. The scanned checkpoint is restored as numpy arrays and the eval model gets
per-layer views of them (`tpu_jobs.model.unscan_params`): no weight is copied. Before any score
is computed the restored weights are checked against the fingerprint recorded at save time (the
manifest row's); a mismatch or any restore/evaluation error writes a summary with
``fatal_error`` set (never valid, so the run can never end on it) and exits 3.

Sharding (``--shard-index K --num-shards N --attempt-id ID``; on a GKE JobSet they default to
``RCPFLOW_SLICE_INDEX``, ``RCPFLOW_NUM_SLICES`` and ``RCPFLOW_ATTEMPT_ID``, which every pod
gets): worker K evaluates the instances i with i % N == K and writes
``attempts/shard_K-of-N.jsonl``; worker 0 then waits (up to ``--shard-timeout-s``) for the other
shards of this attempt, merges them into ``attempts/attempts.jsonl`` and writes the summary
(`tpu_jobs.eval_shards` has the file format and how stale shards are told apart). A shard
missing at the timeout counts as missing attempts: an incomplete summary, never valid. A worker
other than 0 exits 0 once its shard is written, also when the shard records a fatal error:
worker 0 puts that error in the summary and fails (a failing pod would make the JobSet restart
every worker before worker 0 could write it). One shard (the default, the local backend) writes
no shard file, only ``attempts.jsonl``.

Sampling does not depend on the sharding: attempt a of instance i is sampled with the key
fold_in(fold_in(PRNGKey(EVAL_SAMPLING_SEED), i), a), and every call of the sampler has the same
shape (`EVAL_BATCH_ROWS` rows; a short last batch is padded), because XLA's results for a row
can change in the last bits with the batch shape (measured on CPU: up to 5e-7 in the logits
between a 1004-row and a 336-row batch, none between two orders of one shape). So 1 and N
shards give the same attempts, and evaluating a checkpoint twice gives the same bytes.

Exit codes: 0 summary written or reused (worker != 0: shard written or summary reused); 1 bad
input (no manifest, no row N); 2 bad flags; 3 fatal error; 4 incomplete (shards missing at the
timeout).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rcpflow import gate, recipe
from rcpflow.finalize import eval_events
from rcpflow.layout import RunLayout, join
from rcpflow.manifest import ManifestError, load
from rcpflow.mllog import EventRenderer, require_mlperf_logging
from rcpflow.storage import storage_for
from rcpflow.summary import AttemptResult, EvalSummary, build_summary, write_summary
from tpu_jobs import task
from tpu_jobs.checkpoint import CheckpointMeta, restore_params
from tpu_jobs.eval_shards import (
    ATTEMPT_ID_ENV,
    NUM_SLICES_ENV,
    SINGLE,
    SLICE_INDEX_ENV,
    EvalIdentity,
    Gathered,
    Record,
    Shard,
    ShardError,
    Sharding,
    ShardingError,
    gather_shards,
    merge_records,
    resolve_sharding,
    write_shard,
)
from tpu_jobs.model import ModelConfig, unscan_params
from tpu_jobs.rcp_hooks import RUN_IDENTITY_KEY
from tpu_jobs.sampling import LogitsFn, sample_tokens, unscanned_logits_fn

# Key in the checkpoint's `extra` record under which the trainer stores its ModelConfig fields.
MODEL_CONFIG_KEY = "model_config"
EVAL_SAMPLING_SEED = 0
# Rows (instance, attempt) per sampler call; a multiple of the attempts per instance.
EVAL_BATCH_ROWS = 256
# Worker 0's wait for the other shards, after its own; below the deployment's 30-minute watch of
# an eval JobSet, so the incomplete summary is written before Airflow gives up on the job.
DEFAULT_SHARD_TIMEOUT_S = 20 * 60.0
EXIT_OK, EXIT_BAD_INPUT, EXIT_FATAL, EXIT_INCOMPLETE = 0, 1, 3, 4
ATTEMPTS_FILE = "attempts.jsonl"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Target:
    """What is being evaluated and where the results go."""

    checkpoint_path: str
    expected_fingerprint: str | None
    step: int | None  # known from the manifest row; standalone: read from the checkpoint
    timestamp_ms: int | None
    samples_count: int | None
    target_accuracy: float
    summary_path: str
    attempts_dir: str


@dataclass(frozen=True)
class CheckpointFacts:
    """Step, timestamp and samples of the checkpoint; -1 where a failed restore left them
    unknown (standalone mode learns them from the checkpoint)."""

    step: int
    timestamp_ms: int
    samples_count: int


@dataclass(frozen=True)
class Outcome:
    """What one worker did: worker 0 (or the only worker) has the summary; the others only
    wrote their shard."""

    summary: EvalSummary | None
    own_fatal_error: str | None
    missing_shards: tuple[int, ...] = ()
    shard_path: str | None = None


def model_config(meta: CheckpointMeta, where: str) -> ModelConfig:
    if MODEL_CONFIG_KEY not in meta.extra:
        raise ValueError(
            f"{where}: checkpoint records no {MODEL_CONFIG_KEY!r}; cannot build the model"
        )
    return ModelConfig(**meta.extra[MODEL_CONFIG_KEY])


def sampling_settings() -> dict[str, Any]:
    """Everything besides the weights that decides the attempts (part of a shard's identity)."""
    return {
        "seed": EVAL_SAMPLING_SEED,
        "temperature": recipe.EVAL_TEMPERATURE,
        "top_p": recipe.EVAL_TOP_P,
        "answer_length": task.ANSWER_LENGTH,
        "batch_rows": EVAL_BATCH_ROWS,
    }


def attempt_keys(rows: Sequence[tuple[int, int]]) -> jax.Array:
    """One PRNG key per (instance, attempt): a function of those two numbers only."""
    base = jax.random.PRNGKey(EVAL_SAMPLING_SEED)
    instances = jnp.asarray([i for i, _ in rows], dtype=jnp.uint32)
    attempts = jnp.asarray([a for _, a in rows], dtype=jnp.uint32)

    def key(i: jax.Array, a: jax.Array) -> jax.Array:
        return jax.random.fold_in(jax.random.fold_in(base, i), a)

    return jax.vmap(key)(instances, attempts)


def _sample_rows(
    logits_fn: LogitsFn,
    params: Any,
    prompts: jax.Array,
    keys: jax.Array,
    answer_length: int,
    temperature: jax.Array,
    top_p: jax.Array,
) -> jax.Array:
    # Each row is the shared sampler run on that one prompt with that row's own key.
    def one(prompt: jax.Array, key: jax.Array) -> jax.Array:
        row = sample_tokens(
            logits_fn, params, prompt[None, :], key, answer_length, temperature, top_p
        )
        return row[0]

    return jax.vmap(one)(prompts, keys)


_sample_rows_jit = jax.jit(_sample_rows, static_argnames=("logits_fn", "answer_length"))


def run_attempts(cfg: ModelConfig, params: Any, instances: Sequence[int]) -> list[Record]:
    """4 attempts at each of `instances` from the unscanned model fed per-layer views of
    `params`; one record per attempt, sorted by (instance, attempt)."""
    k = recipe.EVAL_ATTEMPTS_PER_INSTANCE
    rows = [(i, a) for i in sorted(instances) for a in range(k)]
    if not rows:
        return []
    outer, layers = unscan_params(params, axis=cfg.param_scan_axis)
    prompts = task.eval_prompts()[[i for i, _ in rows]]
    keys = attempt_keys(rows)
    chunks = []
    for start in range(0, len(rows), EVAL_BATCH_ROWS):
        batch = prompts[start : start + EVAL_BATCH_ROWS]
        batch_keys = keys[start : start + EVAL_BATCH_ROWS]
        real = batch.shape[0]
        if real < EVAL_BATCH_ROWS:  # pad with copies of the first row; their samples are dropped
            batch = np.concatenate([batch, np.repeat(batch[:1], EVAL_BATCH_ROWS - real, axis=0)])
            batch_keys = jnp.concatenate(
                [batch_keys, jnp.repeat(batch_keys[:1], EVAL_BATCH_ROWS - real, axis=0)]
            )
        sampled = _sample_rows_jit(
            unscanned_logits_fn(cfg),
            (outer, layers),
            jnp.asarray(batch, dtype=jnp.int32),
            batch_keys,
            answer_length=task.ANSWER_LENGTH,
            temperature=jnp.float32(recipe.EVAL_TEMPERATURE),
            top_p=jnp.float32(recipe.EVAL_TOP_P),
        )
        chunks.append(np.asarray(sampled)[:real])
    completions = np.concatenate(chunks)
    rewards = np.asarray(task.rewards(prompts, completions))
    correct = np.asarray(task.answers(prompts))
    records = []
    for r, (i, a) in enumerate(rows):
        reward = float(rewards[r])
        records.append(
            {
                "instance": i,
                "attempt": a,
                "prompt": prompts[r].tolist(),
                "completion": completions[r].tolist(),
                "answer": correct[r].tolist(),
                "reward": reward,
                "status": "resolved" if reward == 1.0 else "failed",
            }
        )
    return records


def _identity(target: Target, sharding: Sharding) -> EvalIdentity:
    return EvalIdentity(
        attempt_id=sharding.attempt_id,
        num_shards=sharding.count,
        checkpoint_path=target.checkpoint_path,
        step=target.step,
        timestamp_ms=target.timestamp_ms,
        weights_fingerprint=target.expected_fingerprint,
        instances=recipe.EVAL_SAMPLES,
        attempts_per_instance=recipe.EVAL_ATTEMPTS_PER_INSTANCE,
        sampling=sampling_settings(),
    )


def _evaluate_shard(
    target: Target, sharding: Sharding, start_ms: int
) -> tuple[Shard, CheckpointFacts]:
    """Restore, verify, sample this worker's instances. Any failure becomes the shard's
    `fatal_error` (with no records) instead of an exception."""
    facts = CheckpointFacts(
        step=-1 if target.step is None else target.step,
        timestamp_ms=-1 if target.timestamp_ms is None else target.timestamp_ms,
        samples_count=-1 if target.samples_count is None else target.samples_count,
    )
    records: list[Record] = []
    fatal: str | None = None
    try:
        params, meta = restore_params(target.checkpoint_path, target.expected_fingerprint)
        if target.step is None:
            gbs = int(meta.extra[RUN_IDENTITY_KEY]["global_batch_size"])
            facts = CheckpointFacts(meta.step, meta.timestamp_ms, meta.step * gbs)
        elif meta.step != target.step:
            raise ValueError(
                f"{target.checkpoint_path}: holds step {meta.step}, the manifest row is step "
                f"{target.step}"
            )
        cfg = model_config(meta, target.checkpoint_path)
        records = run_attempts(cfg, params, sharding.instances(recipe.EVAL_SAMPLES))
    except Exception as e:
        fatal = f"{type(e).__name__}: {e}"
        records = []
    shard = Shard(
        index=sharding.index, path="", fatal_error=fatal, start_ms=start_ms, records=tuple(records)
    )
    return shard, facts


def evaluate(
    target: Target,
    sharding: Sharding = SINGLE,
    shard_timeout_s: float = DEFAULT_SHARD_TIMEOUT_S,
) -> Outcome:
    """Evaluate this worker's share of `target`. One shard: write attempts then the summary
    (the commit point). Several: write this worker's shard; worker 0 then gathers the others
    and writes the merged attempts and the summary. Failures end in a summary with
    `fatal_error` (written too), not in an exception."""
    start = now_ms()
    identity = _identity(target, sharding)
    own, facts = _evaluate_shard(target, sharding, start)
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
                    target.attempts_dir, identity, own, timeout_s=shard_timeout_s
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
        attempts_per_instance=recipe.EVAL_ATTEMPTS_PER_INSTANCE,
        instances=recipe.EVAL_SAMPLES,
        checkpoint_step=facts.step,
        checkpoint_timestamp_ms=facts.timestamp_ms,
        samples_count=facts.samples_count,
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


def write_eval_mllog(path: str, summary: EvalSummary) -> None:
    """The eval events of one checkpoint, rendered by the official mllog API (standalone mode)."""
    require_mlperf_logging()
    lines = eval_events(EventRenderer(), summary)
    storage_for(path).write_atomic(path, "".join(line + "\n" for line in lines).encode())


def report(summary: EvalSummary, where: str) -> None:
    print(
        f"step {summary.checkpoint_step}: pass@{recipe.PASS_K} {summary.eval_accuracy:.4f} "
        f"(target > {summary.target_accuracy}, reached: {summary.target_reached}), "
        f"{summary.resolved_attempts}/{summary.expected_attempts} attempts resolved, "
        f"{summary.validation_time_s:.1f}s -> {where}"
    )


def finish(outcome: Outcome, sharding: Sharding, what: str, summary_path: str) -> int:
    """Say what happened and pick the exit code (see the module docstring)."""
    if outcome.summary is None:  # a worker other than 0: its shard is its whole result
        if outcome.own_fatal_error is not None:
            print(
                f"error: {what}: shard {sharding.index} of {sharding.count}: "
                f"{outcome.own_fatal_error} (recorded in {outcome.shard_path}; worker 0 puts it "
                "in the summary)",
                file=sys.stderr,
            )
        else:
            print(f"shard {sharding.index} of {sharding.count} written -> {outcome.shard_path}")
        return EXIT_OK
    summary = outcome.summary
    if summary.fatal_error is not None:
        print(f"error: {what}: {summary.fatal_error}", file=sys.stderr)
        return EXIT_FATAL
    if not summary.complete:
        print(
            f"error: {what}: shard(s) {list(outcome.missing_shards)} of {sharding.count} did not "
            f"arrive; {summary.missing_attempts} attempts count as missing, the summary "
            f"{summary_path} is incomplete",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    report(summary, summary_path)
    return EXIT_OK


def run_step(run_dir: str, step: int, sharding: Sharding, shard_timeout_s: float) -> int:
    layout = RunLayout(run_dir)
    try:
        row = load(layout.manifest).row(step)
    except ManifestError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    reused = gate.valid_summary(layout.root, row)
    if reused is not None:
        print(f"reusing valid summary {layout.summary(step)} (not recomputed)")
        report(reused, layout.summary(step))
        return EXIT_OK
    target = Target(
        checkpoint_path=row.checkpoint_path,
        expected_fingerprint=row.weights_fingerprint,
        step=row.step,
        timestamp_ms=row.timestamp_ms,
        samples_count=row.samples_count,
        target_accuracy=row.target_accuracy,
        summary_path=layout.summary(step),
        attempts_dir=layout.attempts_dir(step),
    )
    outcome = evaluate(target, sharding, shard_timeout_s)
    return finish(outcome, sharding, f"step {step}", layout.summary(step))


def run_standalone(
    checkpoint: str,
    output_dir: str,
    rcp_logging: bool,
    sharding: Sharding,
    shard_timeout_s: float,
) -> int:
    if rcp_logging:
        require_mlperf_logging()  # fail before the work, not after
    target = Target(
        checkpoint_path=checkpoint,
        expected_fingerprint=None,
        step=None,
        timestamp_ms=None,
        samples_count=None,
        target_accuracy=recipe.TARGET_ACCURACY,
        summary_path=join(output_dir, "summary.json"),
        attempts_dir=join(output_dir, "attempts"),
    )
    outcome = evaluate(target, sharding, shard_timeout_s)
    code = finish(outcome, sharding, checkpoint, target.summary_path)
    if code == EXIT_OK and outcome.summary is not None and rcp_logging:
        write_eval_mllog(join(output_dir, "mllog", "eval.out"), outcome.summary)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tpu_jobs.evaluate", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--run-dir", help="run folder (local or gs://) whose manifest row --step to evaluate"
    )
    ap.add_argument("--step", type=int, help="manifest step to evaluate (with --run-dir)")
    ap.add_argument("--checkpoint", help="standalone: one checkpoint folder to evaluate")
    ap.add_argument("--output-dir", help="standalone: where the summary (and mllog/) go")
    ap.add_argument(
        "--rcp-logging",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="standalone: also write the eval events as an MLLOG under OUTPUT_DIR/mllog/",
    )
    ap.add_argument(
        "--shard-index",
        type=int,
        help=f"this worker's shard, 0..N-1 (default: ${SLICE_INDEX_ENV}, else 0)",
    )
    ap.add_argument(
        "--num-shards", type=int, help=f"number of workers N (default: ${NUM_SLICES_ENV}, else 1)"
    )
    ap.add_argument(
        "--attempt-id",
        help="the same id for every worker of one launch, needed with N > 1 "
        f"(default: ${ATTEMPT_ID_ENV})",
    )
    ap.add_argument(
        "--shard-timeout-s",
        type=float,
        default=DEFAULT_SHARD_TIMEOUT_S,
        help="worker 0: how long to wait for the other shards after its own "
        f"(default {DEFAULT_SHARD_TIMEOUT_S:.0f})",
    )
    args = ap.parse_args(argv)  # fmt: skip
    if not args.shard_timeout_s >= 0:
        ap.error(f"--shard-timeout-s must be >= 0, got {args.shard_timeout_s}")
    try:
        sharding = resolve_sharding(args.shard_index, args.num_shards, args.attempt_id, os.environ)
    except ShardingError as e:
        ap.error(str(e))
    if args.run_dir is not None:
        if args.step is None or args.checkpoint or args.output_dir:
            ap.error("--run-dir needs --step, and excludes --checkpoint/--output-dir")
        return run_step(args.run_dir, args.step, sharding, args.shard_timeout_s)
    if args.checkpoint is None or args.output_dir is None or args.step is not None:
        ap.error("give either --run-dir D --step N, or --checkpoint PATH --output-dir OUT")
    return run_standalone(
        args.checkpoint, args.output_dir, args.rcp_logging, sharding, args.shard_timeout_s
    )


if __name__ == "__main__":
    sys.exit(main())
