"""The evaluator's command line, for any trainer's checkpoints (`CheckpointLoader`): `run_step`
(a manifest row), `run_standalone` (one checkpoint folder) and `main`.

    --run-dir D --step N       the checkpoint of manifest row N -> D/eval/step_N/summary.json
                               and attempts/; a valid summary already there is reused
    --checkpoint P --output-dir OUT [--rcp-logging]
                               one checkpoint folder without a manifest (with --rcp-logging also
                               the eval events as an MLLOG in OUT/mllog/eval.out)
    --shard-index K --num-shards N --attempt-id ID
                               worker K of N (where the evaluator shards; defaults from RCPFLOW_*)

A worker may be several processes (the layout variables of `tpu_jobs.rcp.distributed`, for a
loader with `multi_process`): they join one `jax.distributed` system, evaluate together, process
0 alone writes, and every process exits with process 0's code.

Exit codes (docs/tpu_jobs.md): 0 summary written or reused (a worker other than 0: its shard
written); 5 bad input (no manifest, no row N); 2 bad flags or process layout; 3 fatal error;
4 incomplete.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from contextlib import nullcontext

import jax

from rcpflow import recipe
from rcpflow.files.layout import RunLayout, join
from rcpflow.files.storage import storage_for
from rcpflow.records import evaluating
from rcpflow.records.manifest import ManifestError, ManifestRow, load
from rcpflow.records.mllog import EventRenderer, require_mlperf_logging
from rcpflow.records.summary import EvalSummary
from rcpflow.trainer.job_exit import (
    EXIT_FATAL,
    EXIT_INCOMPLETE,
    EXIT_INVALID_INPUT,
    EXIT_OK,
    EXIT_RESTART,
)
from rcpflow.verdict import gate
from rcpflow.verdict.finalize import eval_events
from tpu_jobs.eval.orchestration import Outcome, evaluate
from tpu_jobs.eval.shards import (
    ATTEMPT_ID_ENV,
    DEFAULT_SHARD_TIMEOUT_S,
    NUM_SLICES_ENV,
    SINGLE,
    SLICE_INDEX_ENV,
    Sharding,
    ShardingError,
    resolve_sharding,
)
from tpu_jobs.eval.target import CheckpointLoader, Target
from tpu_jobs.rcp import collectives, distributed, termination

MAX_SHARD_TIMEOUT_S = 7 * 86400.0  # a week; inf would wait for ever


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
    if outcome.follower:  # its process 0 says the rest; the code is process 0's (`main`)
        if outcome.own_fatal_error is not None:
            print(
                f"error: {what}: process {jax.process_index()} of {jax.process_count()}: "
                f"{outcome.own_fatal_error}",
                file=sys.stderr,
            )
            return EXIT_FATAL
        return EXIT_OK
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


def _target(checkpoint_path: str, out_dir: str, row: ManifestRow | None) -> Target:
    """What is evaluated: manifest row `row`'s checkpoint, or (None) one standalone folder;
    the summary and attempts go under `out_dir`."""
    return Target(
        checkpoint_path=checkpoint_path,
        expected_fingerprint=None if row is None else row.weights_fingerprint,
        step=None if row is None else row.step,
        timestamp_ms=None if row is None else row.timestamp_ms,
        samples_count=None if row is None else row.samples_count,
        target_accuracy=recipe.TARGET_ACCURACY if row is None else row.target_accuracy,
        summary_path=join(out_dir, "summary.json"),
        attempts_dir=join(out_dir, "attempts"),
    )


def run_step(loader: CheckpointLoader, run_dir: str, step: int, sharding: Sharding = SINGLE) -> int:
    layout = RunLayout(run_dir)
    row: ManifestRow | None = None
    done: int | None = None  # exit code when there is nothing to evaluate (process 0 decides)
    try:
        row = load(layout.manifest).row(step)
    except ManifestError as e:
        print(f"error: {e}", file=sys.stderr)
        done = EXIT_INVALID_INPUT
    if row is not None and jax.process_index() == 0:
        reused = gate.valid_summary(layout.root, row)
        if reused is not None:
            print(f"reusing valid summary {layout.summary(step)} (not recomputed)")
            report(reused, layout.summary(step))
            done = EXIT_OK
    # Every process of the worker takes the same way: all evaluate, or none.
    [decided] = collectives.from_primary([-1 if done is None else done])
    [unread] = collectives.any_process([row is None])
    if decided >= 0:
        return decided
    if row is None or unread:
        print(f"error: step {step}: another process of this worker could not read the manifest "
              "row", file=sys.stderr)  # fmt: skip
        return EXIT_INVALID_INPUT
    target = _target(row.checkpoint_path, layout.eval_dir(step), row)
    # Retention keeps the checkpoint while this record says it is being evaluated.
    with (
        nullcontext()
        if jax.process_index()
        else evaluating.held(layout.root, step, row.checkpoint_path, remove=sharding.coordinator)
    ):
        outcome = evaluate(target, loader, sharding)
    return finish(outcome, sharding, f"step {step}", layout.summary(step))


def run_standalone(
    loader: CheckpointLoader,
    checkpoint: str,
    output_dir: str,
    rcp_logging: bool,
    sharding: Sharding = SINGLE,
) -> int:
    if rcp_logging:
        require_mlperf_logging()  # fail before the work, not after
    target = _target(checkpoint, output_dir, None)
    outcome = evaluate(target, loader, sharding)
    code = finish(outcome, sharding, checkpoint, target.summary_path)
    if code == EXIT_OK and outcome.summary is not None and rcp_logging:
        write_eval_mllog(join(output_dir, "mllog", "eval.out"), outcome.summary)
    return code


def main(
    argv: Sequence[str] | None,
    loader: CheckpointLoader,
    *,
    prog: str,
    description: str,
    checkpoint_help: str = "standalone: one checkpoint folder to evaluate",
    sharded: bool = True,
) -> int:
    """The evaluator's command line for `loader`'s checkpoints; `sharded` False: one worker
    only (no sharding flags)."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument(
        "--run-dir", help="run folder (local or gs://) whose manifest row --step to evaluate"
    )
    ap.add_argument("--step", type=int, help="manifest step to evaluate (with --run-dir)")
    ap.add_argument("--checkpoint", help=checkpoint_help)
    ap.add_argument("--output-dir", help="standalone: where the summary (and mllog/) go")
    ap.add_argument(
        "--rcp-logging",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="standalone: also write the eval events as an MLLOG under OUTPUT_DIR/mllog/",
    )
    if sharded:
        ap.add_argument(
            "--shard-index",
            type=int,
            help=f"this worker's shard, 0..N-1 (default: ${SLICE_INDEX_ENV}, else 0)",
        )
        ap.add_argument(
            "--num-shards",
            type=int,
            help=f"number of workers N (default: ${NUM_SLICES_ENV}, else 1)",
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
    args = ap.parse_args(argv)
    sharding = SINGLE
    if sharded:
        if not 0 <= args.shard_timeout_s <= MAX_SHARD_TIMEOUT_S:  # also refuses nan
            ap.error(
                f"--shard-timeout-s must be >= 0 and at most {MAX_SHARD_TIMEOUT_S:g} s, got "
                f"{args.shard_timeout_s}"
            )
        try:
            found = resolve_sharding(args.shard_index, args.num_shards, args.attempt_id, os.environ)
        except ShardingError as e:
            ap.error(str(e))
        sharding = dataclasses.replace(found, timeout_s=args.shard_timeout_s)
    if args.run_dir is not None:
        if args.step is None or args.checkpoint or args.output_dir:
            ap.error("--run-dir needs --step, and excludes --checkpoint/--output-dir")
    elif args.checkpoint is None or args.output_dir is None or args.step is not None:
        ap.error("give either --run-dir D --step N, or --checkpoint PATH --output-dir OUT")
    try:
        layout = distributed.layout_from_env()
    except distributed.LayoutError as e:
        ap.error(str(e))
    if layout.multi_process and not loader.multi_process:
        ap.error(
            f"{distributed.NUM_PROCESSES_ENV}={layout.num_processes}: this evaluator runs one "
            "process per worker (give each worker a single host)"
        )
    distributed.initialize(layout)
    # SIGTERM (a deleted JobSet, the verdict's cancel) exits 143 through `Terminated`, as the
    # trainer does. Without a handler of its own, the default action `evaluating.held` falls
    # back to is ignored by the kernel when the evaluator is PID 1 of a container: it removed
    # the in-progress record and went on evaluating (found on real pods).
    termination.exit_on_sigterm()
    if args.run_dir is not None:
        return same_code_on_all(lambda: run_step(loader, args.run_dir, args.step, sharding), prog)
    return same_code_on_all(
        lambda: run_standalone(
            loader, args.checkpoint, args.output_dir, args.rcp_logging, sharding
        ),
        prog,
    )


def same_code_on_all(run: Callable[[], int], prog: str) -> int:
    """`run()`'s exit code on one process; on several, process 0's on every process (an
    exception becomes one error line and code 1, so no process is left waiting for it)."""
    if jax.process_count() == 1:
        return run()
    try:
        code = run()
    except Exception as e:
        print(f"{prog}: error: process {jax.process_index()}: {e!r}", file=sys.stderr)
        code = EXIT_RESTART
    [code] = collectives.from_primary([code])
    return code
