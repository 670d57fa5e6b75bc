"""The rehearsal evaluator: what Tunix's DeepSWE evaluator writes, for a rehearsal checkpoint.

    python -m tpu_jobs.rehearsal.evaluate --run-dir D --step N [--output-root DIR]
        the checkpoint of manifest row N -> DIR/step_N/<UTC stamp>-<8 hex>/summary.json and
        attempts/attempts.jsonl (DIR defaults to D/rehearsal_eval; a new folder each run)
    python -m tpu_jobs.rehearsal.evaluate --checkpoint PATH --output-dir OUT
        one checkpoint folder without a manifest -> OUT/summary.json, OUT/attempts/

Both with ``--profile --time-scale`` (`tpu_jobs.rehearsal.profile`): it waits the profile's
evaluation seconds times the scale before writing. The checkpoint's weights must hash to the
fingerprint it records and, in run mode, be of row N (step, samples, weight-update time and
fingerprint as the row has them). Its 251 tasks x 4 attempts are DeepSWE records
(``canon.p46.deepswe-eval.trajectory.v4``), deterministic per (seed, step): the checkpoint's
solved tasks each have 1..4 solved attempts, the others none, so pass@4 is solved / 251; now and
then a sandbox failure is retried under a new attempt_index (invalid, counted nowhere). The
summary is Tunix's (no eval wall clock, its own ``target_reached`` with ``>=``): rcpflow imports
and verifies it as any foreign evaluator's (``rcpflow eval import``, or the deployment's
``tunix-tree`` result). The same checkpoint gives the same bytes.

Exit 0 written; 1 bad input (no manifest or row N, no rehearsal checkpoint, one of another
step or run); 2 bad flags; 3 the weights do not hash to the recorded fingerprint. Nothing is
written on an error.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from rcpflow import recipe
from rcpflow.files.layout import RunLayout, join
from rcpflow.files.storage import StorageError, storage_for
from rcpflow.files.usererrors import describe
from rcpflow.records.attempts import DEEPSWE_SCHEMA
from rcpflow.records.manifest import ManifestError, ManifestRow, load
from rcpflow.records.summary import AttemptResult, build_summary
from rcpflow.trainer.job_exit import EXIT_FATAL, EXIT_INVALID_INPUT, EXIT_OK
from tpu_jobs.rehearsal.checkpoints import (
    Checkpoint,
    FingerprintMismatchError,
    RehearsalCheckpointError,
    read_checkpoint,
)
from tpu_jobs.rehearsal.profile import Timing, add_timing_arguments, timing_from

PROG = "python -m tpu_jobs.rehearsal.evaluate"
OUTPUT_ROOT = "rehearsal_eval"
ATTEMPTS_FILE = "attempts/attempts.jsonl"
_UNSOLVED = ("MAX_STEPS_REACHED", "MAX_CONTEXT_LIMIT_REACHED", "TIMEOUT")
# About one attempt in this many first fails in its sandbox and is retried.
_SANDBOX_FAILURE_EVERY = 97


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("/".join(map(str, parts)).encode()).digest()


@dataclass(frozen=True)
class Attempt:
    task: int
    sample: int
    solved: bool
    status: str


def attempts_of(checkpoint: Checkpoint) -> list[Attempt]:
    """The 251 x 4 attempts at `checkpoint`, deterministic per (seed, step): the tasks its
    weights solve are the first ones in an order drawn from (seed, step)."""
    w = checkpoint.weights
    order = sorted(range(recipe.EVAL_SAMPLES), key=lambda i: _digest(w.seed, w.step, i))
    solved = set(order[: w.solved_tasks])
    out = []
    for task in range(recipe.EVAL_SAMPLES):
        h = _digest(w.seed, w.step, task, "attempts")
        wins = 1 + h[0] % recipe.EVAL_ATTEMPTS_PER_INSTANCE if task in solved else 0
        for sample in range(recipe.EVAL_ATTEMPTS_PER_INSTANCE):
            ok = sample < wins
            status = "SUCCEEDED" if ok else _UNSOLVED[h[1 + sample] % len(_UNSOLVED)]
            out.append(Attempt(task, sample, ok, status))
    return out


def deepswe_records(checkpoint: Checkpoint, timing: Timing) -> list[dict[str, object]]:
    w = checkpoint.weights
    records: list[dict[str, object]] = []
    for a in attempts_of(checkpoint):
        image = f"rehearsal/task-{a.task:03d}:latest"
        h = _digest(w.seed, w.step, a.task, a.sample, "record")
        base: dict[str, object] = {
            "schema": DEEPSWE_SCHEMA,
            "task_key": image,
            "instance_id": f"task-{a.task:03d}",
            "docker_image": image,
            "sample_index": a.sample,
            # an attempt's own share of the evaluation's time (unscaled: the profile's)
            "elapsed_secs": round(timing.profile.eval_seconds * (0.2 + 0.8 * h[0] / 255), 3),
            "trajectory": [],
        }
        attempt_index = 0
        if int.from_bytes(h[1:3], "big") % _SANDBOX_FAILURE_EVERY == 0:
            records.append(
                {**base, "attempt_index": 0, "status": "SANDBOX_ERROR", "reward": 0.0,
                 "solved": False, "valid": False, "validity_reason": "sandbox crashed"}
            )  # fmt: skip
            attempt_index = 1
        records.append(
            {**base, "attempt_index": attempt_index, "status": a.status,
             "reward": 1.0 if a.solved else 0.0, "solved": a.solved, "valid": True,
             "validity_reason": None}
        )  # fmt: skip
    return records


def tunix_summary(checkpoint: Checkpoint, attempts: Sequence[Attempt]) -> dict[str, object]:
    """Tunix's summary of `attempts`: its fields, no eval wall clock, its own verdict."""
    per_task: list[list[AttemptResult]] = [[] for _ in range(recipe.EVAL_SAMPLES)]
    for a in attempts:
        outcome = "resolved" if a.solved else "failed"
        per_task[a.task].append(AttemptResult(outcome, 1.0 if a.solved else 0.0, a.status))
    s = build_summary(
        per_task,
        checkpoint=checkpoint,
        target_accuracy=recipe.TARGET_ACCURACY,
        eval_start_ms=0,  # not written: Tunix's summaries carry no wall clock
        eval_stop_ms=0,
    )
    return {
        "instances": s.instances,
        "attempts_per_instance": s.attempts_per_instance,
        "expected_attempts": s.expected_attempts,
        "completed_attempts": s.completed_attempts,
        "missing_attempts": s.missing_attempts,
        "error_attempts": s.error_attempts,
        "resolved_attempts": s.resolved_attempts,
        "avg_at_k": s.avg_at_k,
        "pass_at_k": s.pass_at_k,
        "mean_reward": s.mean_reward,
        "status_counts": s.status_counts,
        "complete": s.complete,
        "fatal_error": None,
        "rcp_logged": False,
        "target_accuracy": s.target_accuracy,
        # Tunix's tool decides with >= (the checker needs >); rcpflow never trusts this field
        "target_reached": s.eval_accuracy >= s.target_accuracy,
        "checkpoint_step": s.checkpoint_step,
        "checkpoint_timestamp_ms": s.checkpoint_timestamp_ms,
        "samples_count": s.samples_count,
    }


class NotThisRowError(RehearsalCheckpointError):
    """The checkpoint is not the one manifest row N records."""


def check_row(checkpoint: Checkpoint, row: ManifestRow) -> None:
    found = {
        "step": checkpoint.step,
        "samples_count": checkpoint.samples_count,
        "timestamp_ms": checkpoint.timestamp_ms,
        "seed": checkpoint.run.seed,
        "weights_fingerprint": checkpoint.weights_fingerprint,
    }
    want = {
        "step": row.step,
        "samples_count": row.samples_count,
        "timestamp_ms": row.timestamp_ms,
        "seed": row.seed,
        "weights_fingerprint": row.weights_fingerprint,
    }
    differ = [k for k in found if found[k] != want[k]]
    if not differ:
        return
    text = (
        f"step {row.step}: {row.checkpoint_path} is not the checkpoint its manifest row "
        "records: " + ", ".join(f"{k} {found[k]!r} (the row's {want[k]!r})" for k in differ)
    )
    if differ == ["weights_fingerprint"]:
        raise FingerprintMismatchError(text)
    raise NotThisRowError(text)


def write_result(out_dir: str, checkpoint: Checkpoint, timing: Timing) -> dict[str, object]:
    """Attempts first, the summary last: a folder with a summary is complete."""
    records = deepswe_records(checkpoint, timing)
    attempts_path = join(out_dir, ATTEMPTS_FILE)
    lines = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    storage_for(attempts_path).write_atomic(attempts_path, lines.encode())
    summary = tunix_summary(checkpoint, attempts_of(checkpoint))
    summary_path = join(out_dir, "summary.json")
    text = json.dumps(summary, indent=2, sort_keys=True) + "\n"
    storage_for(summary_path).write_atomic(summary_path, text.encode())
    return summary


def attempt_dir(output_root: str, step: int) -> str:
    """A new folder per evaluation, named as Tunix names them."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return join(output_root, f"step_{step}", f"{stamp}-{secrets.token_hex(4)}")


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Timing]:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="run mode: the run folder (with --step)")
    parser.add_argument("--step", type=int, help="run mode: the manifest row to evaluate")
    parser.add_argument(
        "--output-root", help=f"run mode: the tree's root (default RUN_DIR/{OUTPUT_ROOT})"
    )
    parser.add_argument("--checkpoint", help="standalone: a rehearsal checkpoint folder")
    parser.add_argument("--output-dir", help="standalone: where summary.json goes")
    add_timing_arguments(parser)
    args = parser.parse_args(argv)
    run_mode = args.run_dir is not None or args.step is not None
    standalone = args.checkpoint is not None or args.output_dir is not None
    if run_mode == standalone:
        parser.error("give --run-dir and --step, or --checkpoint and --output-dir")
    if run_mode and (args.run_dir is None or args.step is None):
        parser.error("--run-dir and --step go together")
    if standalone and (args.checkpoint is None or args.output_dir is None):
        parser.error("--checkpoint and --output-dir go together")
    if standalone and args.output_root is not None:
        parser.error("--output-root is for run mode (--run-dir, --step)")
    return args, timing_from(args, parser)


def evaluate(args: argparse.Namespace, timing: Timing) -> tuple[str, dict[str, object]]:
    if args.checkpoint is not None:
        checkpoint = read_checkpoint(args.checkpoint)
        out_dir = args.output_dir
    else:
        layout = RunLayout(args.run_dir)
        row = load(layout.manifest).row(args.step)
        checkpoint = read_checkpoint(row.checkpoint_path)
        check_row(checkpoint, row)
        out_dir = attempt_dir(args.output_root or join(layout.root, OUTPUT_ROOT), args.step)
    time.sleep(timing.eval_s)
    return out_dir, write_result(out_dir, checkpoint, timing)


def main(argv: Sequence[str] | None = None) -> int:
    args, timing = parse_args(argv)
    try:
        out_dir, summary = evaluate(args, timing)
    except FingerprintMismatchError as e:
        print(f"{PROG}: error: {describe(e)}", file=sys.stderr)
        return EXIT_FATAL
    except (RehearsalCheckpointError, ManifestError, StorageError, OSError) as e:
        print(f"{PROG}: error: {describe(e)}", file=sys.stderr)
        return EXIT_INVALID_INPUT
    print(json.dumps({"out_dir": out_dir, "pass_at_k": summary["pass_at_k"]}, sort_keys=True))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
