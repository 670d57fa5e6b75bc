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

Sampling uses a fixed key, so evaluating a checkpoint twice gives the same attempts.

Exit codes: 0 summary written or reused; 1 bad input (no manifest, no row N); 3 fatal error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
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
from tpu_jobs.model import ModelConfig, unscan_params
from tpu_jobs.rcp_hooks import RUN_IDENTITY_KEY
from tpu_jobs.sampling import sample, unscanned_logits_fn

# Key in the checkpoint's `extra` record under which the trainer stores its ModelConfig fields.
MODEL_CONFIG_KEY = "model_config"
EVAL_SAMPLING_SEED = 0
EXIT_OK, EXIT_BAD_INPUT, EXIT_FATAL = 0, 1, 3
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
class Attempts:
    results: list[list[AttemptResult]]
    records: list[dict[str, Any]]


def model_config(meta: CheckpointMeta, where: str) -> ModelConfig:
    if MODEL_CONFIG_KEY not in meta.extra:
        raise ValueError(
            f"{where}: checkpoint records no {MODEL_CONFIG_KEY!r}; cannot build the model"
        )
    return ModelConfig(**meta.extra[MODEL_CONFIG_KEY])


def run_attempts(cfg: ModelConfig, params: Any) -> Attempts:
    """4 attempts per eval instance from the unscanned model fed per-layer views of `params`."""
    outer, layers = unscan_params(params, axis=cfg.param_scan_axis)
    prompts = task.eval_prompts()
    k = recipe.EVAL_ATTEMPTS_PER_INSTANCE
    batch = np.tile(prompts, (k, 1))  # row a * n + i is attempt a of instance i
    completions = np.asarray(
        sample(
            unscanned_logits_fn(cfg),
            (outer, layers),
            batch,
            jax.random.PRNGKey(EVAL_SAMPLING_SEED),
            answer_length=task.ANSWER_LENGTH,
            temperature=recipe.EVAL_TEMPERATURE,
            top_p=recipe.EVAL_TOP_P,
        )
    )
    rewards = np.asarray(task.rewards(batch, completions))
    correct = np.asarray(task.answers(prompts))
    n = prompts.shape[0]
    results: list[list[AttemptResult]] = [[] for _ in range(n)]
    records = []
    for a in range(k):
        for i in range(n):
            reward = float(rewards[a * n + i])
            status = "resolved" if reward == 1.0 else "failed"
            results[i].append(AttemptResult(status=status, reward=reward))
            records.append(
                {
                    "instance": i,
                    "attempt": a,
                    "prompt": prompts[i].tolist(),
                    "completion": completions[a * n + i].tolist(),
                    "answer": correct[i].tolist(),
                    "reward": reward,
                    "status": status,
                }
            )
    records.sort(key=lambda r: (r["instance"], r["attempt"]))
    return Attempts(results=results, records=records)


def evaluate(target: Target) -> tuple[EvalSummary, CheckpointMeta | None]:
    """Restore, verify, sample, score; write attempts then the summary (the commit point).

    Any failure gives a summary with `fatal_error` (written too) instead of an exception.
    """
    start = now_ms()
    meta: CheckpointMeta | None = None
    attempts: list[list[AttemptResult]] = []
    fatal: str | None = None
    # Standalone mode learns these from the checkpoint; -1 marks "unknown" in a fatal summary.
    step = -1 if target.step is None else target.step
    timestamp = -1 if target.timestamp_ms is None else target.timestamp_ms
    samples = -1 if target.samples_count is None else target.samples_count
    try:
        params, meta = restore_params(target.checkpoint_path, target.expected_fingerprint)
        if target.step is None:
            step, timestamp = meta.step, meta.timestamp_ms
            samples = meta.step * int(meta.extra[RUN_IDENTITY_KEY]["global_batch_size"])
        elif meta.step != target.step:
            raise ValueError(
                f"{target.checkpoint_path}: holds step {meta.step}, the manifest row is step "
                f"{target.step}"
            )
        result = run_attempts(model_config(meta, target.checkpoint_path), params)
        body = "".join(json.dumps(r, sort_keys=True) + "\n" for r in result.records)
        path = join(target.attempts_dir, ATTEMPTS_FILE)
        storage_for(path).write_atomic(path, body.encode())
        attempts = result.results
    except Exception as e:  # noqa: BLE001 - every failure must end as a fatal summary
        fatal = f"{type(e).__name__}: {e}"
        attempts = []
    summary = build_summary(
        attempts,
        attempts_per_instance=recipe.EVAL_ATTEMPTS_PER_INSTANCE,
        instances=recipe.EVAL_SAMPLES,
        checkpoint_step=step,
        checkpoint_timestamp_ms=timestamp,
        samples_count=samples,
        target_accuracy=target.target_accuracy,
        eval_start_ms=start,
        eval_stop_ms=now_ms(),
        fatal_error=fatal,
    )
    write_summary(target.summary_path, summary)
    return summary, meta


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
    summary, _ = evaluate(
        Target(
            checkpoint_path=row.checkpoint_path,
            expected_fingerprint=row.weights_fingerprint,
            step=row.step,
            timestamp_ms=row.timestamp_ms,
            samples_count=row.samples_count,
            target_accuracy=row.target_accuracy,
            summary_path=layout.summary(step),
            attempts_dir=layout.attempts_dir(step),
        )
    )
    if summary.fatal_error is not None:
        print(f"error: step {step}: {summary.fatal_error}", file=sys.stderr)
        return EXIT_FATAL
    report(summary, layout.summary(step))
    return EXIT_OK


def run_standalone(checkpoint: str, output_dir: str, rcp_logging: bool) -> int:
    if rcp_logging:
        require_mlperf_logging()  # fail before the work, not after
    summary, _ = evaluate(
        Target(
            checkpoint_path=checkpoint,
            expected_fingerprint=None,
            step=None,
            timestamp_ms=None,
            samples_count=None,
            target_accuracy=recipe.TARGET_ACCURACY,
            summary_path=join(output_dir, "summary.json"),
            attempts_dir=join(output_dir, "attempts"),
        )
    )
    if summary.fatal_error is not None:
        print(f"error: {checkpoint}: {summary.fatal_error}", file=sys.stderr)
        return EXIT_FATAL
    if rcp_logging:
        write_eval_mllog(join(output_dir, "mllog", "eval.out"), summary)
    report(summary, join(output_dir, "summary.json"))
    return EXIT_OK


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
    args = ap.parse_args(argv)  # fmt: skip
    if args.run_dir is not None:
        if args.step is None or args.checkpoint or args.output_dir:
            ap.error("--run-dir needs --step, and excludes --checkpoint/--output-dir")
        return run_step(args.run_dir, args.step)
    if args.checkpoint is None or args.output_dir is None or args.step is not None:
        ap.error("give either --run-dir D --step N, or --checkpoint PATH --output-dir OUT")
    return run_standalone(args.checkpoint, args.output_dir, args.rcp_logging)


if __name__ == "__main__":
    sys.exit(main())
