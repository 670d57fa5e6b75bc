"""The MaxText training job (``python -m tpu_jobs.maxtext.train --run-dir D --seed S [...]``).

MaxText's own model, config, train step and checkpointer (`tpu_jobs.maxtext.model`) train the
digit task: each update is MaxText's ``train_step`` on ``--global-batch-size`` fresh prompts and
their verified answers, the loss on the answer token (MaxText's pre-training step is supervised;
why not GRPO: docs/maxtext.md). rcpflow records around it: after each update the job blocks on
the updated parameters, then takes the weight-update timestamp (`TrainingRecorder.on_update`);
from ``val_start_at`` on it fingerprints the scanned weights on the device (as trained, and
rounded to bf16 for the evaluator), and MaxText saves a native scanned checkpoint of the step
(async) with that record in its metadata; the manifest row follows once the step has committed
(`tpu_jobs.maxtext.checkpoints.CommitWatch`). A stop request for this run ends training after
the step that sees it; ``block_stop`` is backdated to the last update. A rerun with the same
flags resumes from the newest committed checkpoint (MaxText restores it). One process; the run
flags and exit codes are the toy trainer's (`tpu_jobs.rcp.job_cli`, docs/tpu_jobs.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.records.run_identity import RunIdentity
from rcpflow.trainer.job_exit import EXIT_SIGTERM
from tpu_jobs.maxtext import config, model
from tpu_jobs.maxtext.checkpoints import (
    CheckpointRecord,
    CommittedStep,
    CommitWatch,
    complete_steps,
    read_record,
    step_path,
)
from tpu_jobs.maxtext.layout import as_bf16
from tpu_jobs.rcp import collectives, distributed, job_cli, job_errors, termination
from tpu_jobs.rcp.callbacks import Committed, resume_committed, run_mismatch
from tpu_jobs.rcp.checkpoint_format import CheckpointError
from tpu_jobs.rcp.fingerprint import start_fingerprint
from tpu_jobs.rcp.job_cli import RunConfig, TrainResult, say
from tpu_jobs.rcp.saver import SaveFailedError

PROG = "python -m tpu_jobs.maxtext.train"


@dataclass(frozen=True)
class TrainConfig(RunConfig):
    # Measured on CPU (gbs 256, ModelConfig(), seeds 0-2; docs/maxtext.md): pass@4 > 0.69 after
    # 20-27 updates at 3e-4, so with val_start_at 18 a few checkpoints are evaluated below the
    # target before one passes (1e-3 passes at ~10, before the first evaluated checkpoint).
    OPEN_LEARNING_RATE: ClassVar[float] = 3e-4

    max_steps: int = 50
    model: config.ModelConfig = field(default_factory=config.ModelConfig)


def committed_checkpoints(
    checkpoints_dir: str, identity: RunIdentity, val_start: int
) -> dict[int, Committed]:
    """This run's committed MaxText checkpoints by step; one of another run is an error."""
    found = {}
    for step in complete_steps(checkpoints_dir):
        path = step_path(checkpoints_dir, step)
        record = read_record(path)
        if record.run != identity.arguments():
            raise run_mismatch(step, path, dict(record.run), identity)
        if record.step != step or step < val_start:
            raise CheckpointError(
                f"step {step}: {path} records step {record.step} (val_start_at {val_start}); one "
                "optimizer update per MaxText step is this job's contract"
            )
        found[step] = Committed(step, path, record.timestamp_ms, record.weights_fingerprint)
    return found


def _close_after_failure(watch: CommitWatch, exc: BaseException) -> None:
    """Let the rows of the saves that were started come (a resume continues from them), while
    `exc` unwinds the loop; a failure of the watch becomes a note on `exc`."""
    try:
        watch.close()
    except SaveFailedError as e:
        exc.add_note(f"(also: recording a committed checkpoint failed: {e})")


def train(cfg: TrainConfig) -> TrainResult:
    hp = cfg.hyperparameters()
    val_start = recipe.val_start_at(hp.global_batch_size, cfg.val_start_at)
    checkpoints_dir = RunLayout(cfg.run_dir).checkpoints_dir
    identity = RunIdentity.of_run(cfg.seed, hp, val_start)
    recorder = job_cli.run_recorder(cfg, hp, val_start)  # one update, the whole batch, one device
    committed = committed_checkpoints(checkpoints_dir, identity, val_start)
    resumed = resume_committed(
        recorder, committed, path_of=lambda step: step_path(checkpoints_dir, step)
    )
    ended = resumed is not None and resumed.finished
    newest = max(committed, default=0)
    recorder.on_init_start()
    if ended or newest == hp.max_steps:  # nothing left to train: no MaxText, only the end
        recorder.on_train_end()
        say({"event": "nothing_to_train", "step": newest})
        return TrainResult(first_step=newest + 1, last_step=newest, resumed_from=newest)
    trainer = model.build_trainer(config.train_overrides(cfg.model, hp, cfg.seed, cfg.run_dir))
    restored = trainer.restored_step
    if restored != newest:
        raise CheckpointError(
            f"MaxText restored step {restored}, the newest committed checkpoint of this run is "
            f"step {newest}"
        )
    say(
        {
            **job_cli.start_event(hp, val_start, restored or None),
            "trainer": "maxtext",
            "compile_s": round(trainer.compile_s, 2),
        }
    )
    recorder.on_run_start()
    records: dict[int, CheckpointRecord] = {}

    def on_commit(saved: CommittedStep) -> None:
        fingerprint = records[saved.step].weights_fingerprint
        recorder.on_checkpoint_committed(
            saved.step, saved.path, {"weights_fingerprint": fingerprint}
        )

    watch = CommitWatch(checkpoints_dir, on_commit)
    last = restored
    stopped_before = recorder.stop_requested()
    if stopped_before:  # the request came before the crash this run resumes from
        say({"event": "stop_requested", "step": restored})
    try:
        with termination.deferred() as sigterm:
            first = hp.max_steps + 1 if stopped_before else restored + 1
            for step in range(first, hp.max_steps + 1):
                started = time.perf_counter()
                metrics = trainer.step(model.train_batch(cfg.seed, step, hp.global_batch_size))
                params = trainer.params()
                collectives.wait_everywhere(params)  # the update has completed
                computed = time.perf_counter()
                waited_before = watch.waited_s
                timestamp_ms = recorder.on_update(step)
                if step >= val_start:
                    # On the device; the bf16 one is what the evaluator's weights must match.
                    trained, rounded = start_fingerprint(params), start_fingerprint(as_bf16(params))
                    record = CheckpointRecord(
                        step=step,
                        timestamp_ms=timestamp_ms,
                        weights_fingerprint=trained.result(),
                        weights_fingerprint_bf16=rounded.result(),
                        run=identity.arguments(),
                        model=cfg.model.to_json(),
                    )
                    records[step] = record
                    trainer.save(record)
                    watch.expect(step)
                recorded = time.perf_counter()
                say(
                    {
                        "step": step,
                        "loss": round(float(metrics["learning/loss"]), 6),
                        "timestamp_ms": timestamp_ms,
                        "step_s": round(computed - started, 4),
                        "recording_s": round(recorded - computed, 4),
                        "save_wait_s": round(watch.waited_s - waited_before, 4),
                    }
                )
                last = step
                if sigterm:
                    say({"event": "sigterm", "step": step})
                    raise termination.Terminated(EXIT_SIGTERM)
                if recorder.stop_requested():
                    say({"event": "stop_requested", "step": step})
                    break
            watch.close()
            trainer.close()
    except BaseException as e:
        _close_after_failure(watch, e)
        raise
    recorder.on_train_end()
    return TrainResult(first_step=restored + 1, last_step=last, resumed_from=restored or None)


def parse_args(argv: Sequence[str] | None) -> TrainConfig:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    job_cli.add_run_flags(parser, TrainConfig)
    defaults = config.ModelConfig()
    for name, what in (
        ("emb_dim", "model width (default %(default)s; recorded in each checkpoint)"),
        ("num_heads", "attention heads (default %(default)s)"),
        ("head_dim", "width of a head (default %(default)s)"),
        ("mlp_dim", "feed-forward width (default %(default)s)"),
        ("num_layers", "decoder layers, scanned (default %(default)s)"),
    ):
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=int, default=getattr(defaults, name), help=what)

    def build(args: argparse.Namespace) -> TrainConfig:
        try:
            size = config.ModelConfig(
                emb_dim=args.emb_dim,
                num_heads=args.num_heads,
                head_dim=args.head_dim,
                mlp_dim=args.mlp_dim,
                num_layers=args.num_layers,
            )
        except ValueError as e:
            parser.error(str(e))
        return TrainConfig(**job_cli.run_fields(args), model=size)

    return job_cli.parse_run_args(parser, argv, build)


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        layout = distributed.layout_from_env()
        if layout.multi_process:
            raise distributed.LayoutError(
                f"{layout.num_processes} processes: this job runs one process (MaxText's "
                "multi-host setup is not wired here; docs/maxtext.md)"
            )
    except distributed.LayoutError as e:
        return job_errors.report(PROG, e)
    # SIGTERM (preemption, eviction) unwinds like a crash: the started saves get their rows.
    termination.exit_on_sigterm()
    return job_cli.run_job(PROG, cfg, train)


if __name__ == "__main__":
    sys.exit(main())
