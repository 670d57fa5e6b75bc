"""The rehearsal trainer: ``python -m tpu_jobs.rehearsal.train --run-dir D --seed S [...]``.

Flags as the toy trainer's (``--global-batch-size --max-steps --val-start-at --division``) and
``--profile --curve --time-scale`` (`tpu_jobs.rehearsal.profile`). Each step waits the
profile's step seconds (times the scale; the clock of the run, so file writes do not add up),
then records its weight update through `rcpflow.trainer.recorder.TrainingRecorder`; from
val_start_at on it saves the step's checkpoint (`tpu_jobs.rehearsal.checkpoints`: the tasks the
curve says it solves) and, once written, its manifest row with the weights' fingerprint. After each
step it honours a stop request for this run; at the end ``block_stop`` is backdated to the last
update. Both divisions use the recipe's hyperparameters (nothing is learned).

A rerun with the same arguments resumes: the recorder continues the log and the manifest,
a checkpoint written without its row (a crash between the two) gets its row with the update
time it records, and training goes on after the newest checkpoint; a finished run changes
nothing. Exit 0 done; 2 bad arguments (the message names the flag: also a run folder holding
another run); 1 a run folder that cannot be resumed as it is; one line each.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from rcpflow import recipe
from rcpflow.files.storage import StorageError
from rcpflow.planning.rehearsal import PassCurve
from rcpflow.records.manifest import ManifestError
from rcpflow.records.mllog import MLLogError, require_mlperf_logging
from rcpflow.records.run_identity import RunIdentity
from rcpflow.trainer import job_exit
from rcpflow.trainer.recorder import RecorderError, TrainingRecorder
from tpu_jobs.rehearsal.checkpoints import (
    Checkpoint,
    RehearsalCheckpointError,
    Weights,
    checkpoint_dir,
    complete_steps,
    read_checkpoint,
    write_checkpoint,
)
from tpu_jobs.rehearsal.profile import (
    DEFAULT_CURVE,
    Timing,
    add_timing_arguments,
    curve_from,
    timing_from,
)

PROG = "python -m tpu_jobs.rehearsal.train"
DEFAULT_GLOBAL_BATCH_SIZE = 256
DEFAULT_MAX_STEPS = 50
# Told in one line with the job contract's code (`rcpflow.trainer.job_exit`): 5 for the invalid
# ones.
INVALID_INPUT_ERRORS = (RecorderError, RehearsalCheckpointError)
RUN_STATE_ERRORS = (*INVALID_INPUT_ERRORS, ManifestError, MLLogError, StorageError, OSError)


class RunMismatchError(ValueError):
    """The run folder holds another run than these arguments describe."""


@dataclass(frozen=True)
class Config:
    run_dir: str
    seed: int
    hp: recipe.Hyperparameters
    val_start_at: int
    timing: Timing
    curve: PassCurve

    @property
    def identity(self) -> RunIdentity:
        return RunIdentity.of_run(self.seed, self.hp, self.val_start_at)


def _say(record: dict[str, object]) -> None:
    print(json.dumps(record, sort_keys=True), flush=True)


def _check_identity(config: Config) -> None:
    """The newest checkpoint in the folder must be this run's (else: the flags that differ;
    the recorder checks the log and the rows)."""
    ours = config.identity
    for step in complete_steps(config.run_dir)[-1:]:
        found = read_checkpoint(checkpoint_dir(config.run_dir, step)).run
        if found != ours:
            raise RunMismatchError(
                f"step {step}: the checkpoint in {config.run_dir} belongs to another run "
                f"({ours.differing_flags(found.arguments())}); resume with that run's "
                "arguments, or use another run_dir"
            )


def _resume(config: Config, rec: TrainingRecorder) -> tuple[int, bool]:
    """(the last step done, whether the run had already ended)."""
    saved = [s for s in complete_steps(config.run_dir) if s >= config.val_start_at]
    resumed = rec.resume()
    if resumed is None:
        if saved:
            raise RehearsalCheckpointError(
                f"cannot resume: checkpoints of steps {saved[0]}..{saved[-1]} exist but neither "
                f"the run's MLLOG {rec.mllog_path} nor its manifest does (start afresh in "
                "another run_dir)"
            )
        return 0, False
    last_row = resumed.step
    unsaved = rec.row_without_checkpoint(saved)
    if unsaved is not None:
        raise RehearsalCheckpointError(
            f"step {unsaved}: manifest row points at {checkpoint_dir(config.run_dir, unsaved)}, "
            "which holds no rehearsal checkpoint (deleted by hand?); refusing to resume"
        )
    for step in saved:
        if last_row is not None and step <= last_row:
            continue
        # written before a crash, its row not: the row it would have had
        c = read_checkpoint(checkpoint_dir(config.run_dir, step))
        rec.on_update(step, timestamp_ms=c.timestamp_ms)
        rec.on_checkpoint_committed(
            step,
            checkpoint_dir(config.run_dir, step),
            {"weights_fingerprint": c.weights_fingerprint},
        )
    done = rec.last_update
    return (0 if done is None else done[0]), resumed.finished


def train(config: Config) -> int:
    """Train (or resume) the run; the last step done."""
    hp = config.hp
    _check_identity(config)
    rec = TrainingRecorder(
        config.run_dir, seed=config.seed, hyperparameters=hp, val_start_at=config.val_start_at
    )
    last, finished = _resume(config, rec)
    rec.on_init_start()
    rec.on_run_start()
    _say(
        {
            "event": "start",
            "resumed_from": last or None,
            "division": hp.division,
            "global_batch_size": hp.global_batch_size,
            "val_start_at": config.val_start_at,
            "max_steps": hp.max_steps,
            "step_s": config.timing.step_s,
        }
    )
    stop = last > 0 and not finished and rec.stop_requested()
    first = hp.max_steps + 1 if finished or stop else last + 1
    started = time.monotonic()
    for step in range(first, hp.max_steps + 1):
        # the run's clock: step k of this process ends (k - first + 1) step times after start
        wait = started + (step - first + 1) * config.timing.step_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        timestamp_ms = rec.on_update(step)
        record: dict[str, object] = {"step": step, "timestamp_ms": timestamp_ms}
        if step >= config.val_start_at:
            weights = Weights(config.seed, step, config.curve.solved(config.seed, step))
            folder = write_checkpoint(
                config.run_dir,
                Checkpoint(
                    run=config.identity,
                    step=step,
                    samples_count=step * hp.global_batch_size,
                    timestamp_ms=timestamp_ms,
                    weights=weights,
                    weights_fingerprint=weights.fingerprint,
                ),
            )
            rec.on_checkpoint_committed(step, folder, {"weights_fingerprint": weights.fingerprint})
            record["pass_at_4"] = round(config.curve.pass_at_4(config.seed, step), 4)
        _say(record)
        last = step
        if rec.stop_requested():
            _say({"event": "stop_requested", "step": step})
            break
    rec.on_train_end()
    return last


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="local folder or gs://bucket/prefix")
    parser.add_argument("--seed", type=int, required=True, help="a seed of the curve")
    parser.add_argument(
        "--global-batch-size",
        type=int,
        default=DEFAULT_GLOBAL_BATCH_SIZE,
        help=f"generations per step, prompts x 16 (default {DEFAULT_GLOBAL_BATCH_SIZE})",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=DEFAULT_MAX_STEPS,
        help=f"optimizer updates (default {DEFAULT_MAX_STEPS})",
    )
    parser.add_argument(
        "--val-start-at",
        type=int,
        default=None,
        help="first checkpointed step (default: the recipe's, ceil(2.5+3840/gbs))",
    )
    parser.add_argument("--division", choices=recipe.DIVISIONS, default="open")
    parser.add_argument(
        "--curve",
        default=str(DEFAULT_CURVE),
        help="pass@4 by step per seed, CSV (default: the shipped curve, seeds 1..3)",
    )
    add_timing_arguments(parser)
    args = parser.parse_args(argv)
    try:
        hp, val_start = recipe.trainer_run(
            args.division, args.global_batch_size, args.max_steps, args.val_start_at
        )
    except ValueError as e:
        parser.error(str(e))
    timing = timing_from(args, parser)
    curve = curve_from(args, parser)
    if args.seed not in curve.seeds:
        parser.error(
            f"--seed {args.seed}: {args.curve} has seeds {', '.join(map(str, curve.seeds))}"
        )
    if hp.max_steps > curve.steps:
        parser.error(f"--max-steps {hp.max_steps}: {args.curve} stops at step {curve.steps}")
    return Config(args.run_dir, args.seed, hp, val_start, timing, curve)


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    require_mlperf_logging()
    started = time.monotonic()
    try:
        last = train(config)
    except (RunMismatchError, *RUN_STATE_ERRORS) as e:
        return job_exit.report(PROG, e, (RunMismatchError,), INVALID_INPUT_ERRORS)
    _say({"event": "done", "last_step": last, "wall_s": round(time.monotonic() - started, 2)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
