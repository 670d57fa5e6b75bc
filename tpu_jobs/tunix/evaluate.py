"""Evaluating a Tunix checkpoint: ``python -m tpu_jobs.tunix_evaluate``, pass@4 on 251 instances.

    python -m tpu_jobs.tunix_evaluate --run-dir D --step N
        the checkpoint of manifest row N -> D/eval/step_N/summary.json (+ attempts/attempts.jsonl);
        a valid summary already there is reused, not recomputed.
    python -m tpu_jobs.tunix_evaluate --checkpoint PATH --output-dir OUT [--rcp-logging]
        one Tunix step folder (``.../actor/<step>``) without a manifest -> OUT/summary.json,
        OUT/attempts/, and with --rcp-logging the eval events in OUT/mllog/eval.out.

The actor's parameters are restored from Tunix's layout (the ``model_params`` item, as numpy
arrays) into a Qwen3 of the size the checkpoint's rcpflow record names. Before anything is
scored, their fingerprint is recomputed and must equal the one recorded at save time (in the
checkpoint's record and, in run mode, in the manifest row). Each instance gets 4 attempts
sampled at the validation settings (temperature 0.1, top_p 0.95); attempt a of instance i
uses the toy evaluator's key (`tpu_jobs.eval_sampling.attempt_keys`), and all 1004 attempts are
sampled in one call of one shape, so evaluating a checkpoint twice gives the same bytes. The
sampler is the project's (`tpu_jobs.sampling.filter_logits`) on the Qwen3's next-token logits:
the same computation as Tunix's rollout for these unpadded fixed-length prompts.

Exit codes as ``tpu_jobs.evaluate``: 0 summary written or reused; 1 bad input (no manifest, no
row N); 2 bad flags; 3 fatal error (restore, fingerprint or evaluation failed: the summary is
written with ``fatal_error`` set, never valid). One worker only (no sharding flags).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rcpflow import gate, recipe
from rcpflow.layout import RunLayout, join
from rcpflow.manifest import ManifestError, load
from rcpflow.mllog import require_mlperf_logging
from rcpflow.storage import storage_for
from rcpflow.summary import AttemptResult, EvalSummary, build_summary, write_summary
from tpu_jobs import task
from tpu_jobs.eval_orchestration import ATTEMPTS_FILE
from tpu_jobs.eval_sampling import attempt_keys
from tpu_jobs.evaluate import report, write_eval_mllog
from tpu_jobs.fingerprint import FingerprintMismatchError, weights_fingerprint
from tpu_jobs.sampling import filter_logits
from tpu_jobs.tunix import checkpoints, policy

EXIT_OK, EXIT_BAD_INPUT, EXIT_FATAL = 0, 1, 3
BATCH_ROWS = 1024  # >= 251 x 4, a multiple of the mesh's devices: one sampler call, one shape


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Target:
    checkpoint_path: str
    expected_fingerprint: str | None  # the manifest row's; standalone: the checkpoint's own
    step: int | None
    timestamp_ms: int | None
    samples_count: int | None
    target_accuracy: float
    summary_path: str
    attempts_dir: str


@cache
def _sampler(config: policy.PolicyConfig) -> Any:
    """The jitted sampler for one policy size (nnx graph definitions are not hashable, so the
    structure is closed over instead of passed as a static argument)."""
    graphdef, _ = nnx.split(policy.abstract(config))

    def sample(
        state: Any, prompts: jax.Array, keys: jax.Array, temperature: jax.Array, top_p: jax.Array
    ) -> jax.Array:
        model = nnx.merge(graphdef, state)
        tokens = prompts
        for i in range(task.ANSWER_LENGTH):
            logits = filter_logits(policy.last_logits(model, tokens), temperature, top_p)
            step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, i)
            nxt = jax.vmap(jax.random.categorical)(step_keys, logits)
            tokens = jnp.concatenate([tokens, nxt[:, None].astype(tokens.dtype)], axis=1)
        return tokens[:, prompts.shape[1] :]

    return jax.jit(sample)


def load_policy(
    path: str, expected: str | None
) -> tuple[policy.PolicyConfig, Any, checkpoints.CheckpointRecord]:
    """(policy size, nnx state, record) of a committed Tunix step, its weights verified."""
    _, record = checkpoints.read_record(path)
    if expected is not None and expected != record.weights_fingerprint:
        raise FingerprintMismatchError(
            f"{path}: checkpoint records fingerprint {record.weights_fingerprint}, the manifest "
            f"expects {expected}: not the checkpoint the manifest recorded"
        )
    params = checkpoints.restore_params(path)
    got = weights_fingerprint(params)
    if got != record.weights_fingerprint:
        raise FingerprintMismatchError(
            f"{path}: restored weights have fingerprint {got}, recorded at save "
            f"{record.weights_fingerprint}: corrupted or not this checkpoint; refusing to score"
        )
    config = policy.PolicyConfig.from_json(record.policy, where=path)
    _, state = nnx.split(policy.abstract(config))
    state.replace_by_pure_dict(jax.tree.map(jnp.asarray, params))
    return config, state, record


def run_attempts(config: policy.PolicyConfig, state: Any) -> list[dict[str, Any]]:
    k = recipe.EVAL_ATTEMPTS_PER_INSTANCE
    rows = [(i, a) for i in range(recipe.EVAL_SAMPLES) for a in range(k)]
    prompts = task.eval_prompts()[[i for i, _ in rows]]
    keys = attempt_keys(rows)
    pad = BATCH_ROWS - len(rows)
    batch = np.concatenate([prompts, np.repeat(prompts[:1], pad, axis=0)])
    batch_keys = jnp.concatenate([keys, jnp.repeat(keys[:1], pad, axis=0)])
    with jax.set_mesh(policy.mesh()):
        sampled = _sampler(config)(
            state,
            jnp.asarray(batch, dtype=jnp.int32),
            batch_keys,
            temperature=jnp.float32(recipe.EVAL_TEMPERATURE),
            top_p=jnp.float32(recipe.EVAL_TOP_P),
        )
    completions = np.asarray(sampled)[: len(rows)]
    rewards = np.asarray(task.rewards(prompts, completions))
    correct = np.asarray(task.answers(prompts))
    return [
        {
            "instance": i,
            "attempt": a,
            "prompt": prompts[r].tolist(),
            "completion": completions[r].tolist(),
            "answer": correct[r].tolist(),
            "reward": float(rewards[r]),
            "status": "resolved" if rewards[r] == 1.0 else "failed",
        }
        for r, (i, a) in enumerate(rows)
    ]


def evaluate(target: Target) -> EvalSummary:
    """Restore, verify, sample, score; any failure becomes the summary's ``fatal_error``."""
    start = now_ms()
    step = -1 if target.step is None else target.step
    timestamp_ms = -1 if target.timestamp_ms is None else target.timestamp_ms
    samples = -1 if target.samples_count is None else target.samples_count
    records: list[dict[str, Any]] = []
    fatal: str | None = None
    try:
        config, state, record = load_policy(target.checkpoint_path, target.expected_fingerprint)
        if target.step is None:
            step, timestamp_ms = record.step, record.timestamp_ms
            samples = record.step * int(record.run["global_batch_size"])
        elif record.step != target.step or record.timestamp_ms != target.timestamp_ms:
            raise ValueError(
                f"{target.checkpoint_path}: holds step {record.step} at {record.timestamp_ms} "
                f"ms, the manifest row is step {target.step} at {target.timestamp_ms} ms"
            )
        records = run_attempts(config, state)
        body = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
        path = join(target.attempts_dir, ATTEMPTS_FILE)
        storage_for(path).write_atomic(path, body.encode())
    except Exception as e:
        fatal, records = f"{type(e).__name__}: {e}", []
    attempts: list[list[AttemptResult]] = [[] for _ in range(recipe.EVAL_SAMPLES)]
    for r in records:
        attempts[r["instance"]].append(AttemptResult(status=r["status"], reward=r["reward"]))
    summary = build_summary(
        attempts,
        attempts_per_instance=recipe.EVAL_ATTEMPTS_PER_INSTANCE,
        instances=recipe.EVAL_SAMPLES,
        checkpoint_step=step,
        checkpoint_timestamp_ms=timestamp_ms,
        samples_count=samples,
        target_accuracy=target.target_accuracy,
        eval_start_ms=start,
        eval_stop_ms=now_ms(),
        fatal_error=fatal,
    )
    write_summary(target.summary_path, summary)
    return summary


def finish(summary: EvalSummary, what: str, where: str) -> int:
    if summary.fatal_error is not None:
        print(f"error: {what}: {summary.fatal_error}", file=sys.stderr)
        return EXIT_FATAL
    report(summary, where)
    return EXIT_OK


def run_step(run_dir: str, step: int) -> int:
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
    return finish(evaluate(target), f"step {step}", layout.summary(step))


def run_standalone(checkpoint: str, output_dir: str, rcp_logging: bool) -> int:
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
    summary = evaluate(target)
    code = finish(summary, checkpoint, target.summary_path)
    if code == EXIT_OK and rcp_logging:
        write_eval_mllog(join(output_dir, "mllog", "eval.out"), summary)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tpu_jobs.tunix_evaluate", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--run-dir", help="run folder whose manifest row --step to evaluate")
    ap.add_argument("--step", type=int, help="manifest step to evaluate (with --run-dir)")
    ap.add_argument("--checkpoint", help="standalone: one Tunix step folder (.../actor/<step>)")
    ap.add_argument("--output-dir", help="standalone: where the summary (and mllog/) go")
    ap.add_argument(
        "--rcp-logging",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="standalone: also write the eval events as an MLLOG under OUTPUT_DIR/mllog/",
    )
    args = ap.parse_args(argv)
    if args.run_dir is not None:
        if args.step is None or args.checkpoint or args.output_dir:
            ap.error("--run-dir needs --step, and excludes --checkpoint/--output-dir")
        return run_step(args.run_dir, args.step)
    if args.checkpoint is None or args.output_dir is None or args.step is not None:
        ap.error("give either --run-dir D --step N, or --checkpoint PATH --output-dir OUT")
    if args.rcp_logging:
        require_mlperf_logging()  # fail before the work, not after
    return run_standalone(args.checkpoint, args.output_dir, args.rcp_logging)
