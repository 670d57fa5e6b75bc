"""The toy GRPO training job (``python -m tpu_jobs.train --run-dir D --seed S [...]``).

Trains the toy policy on the digit task with GRPO on every device of every process (an FSDP mesh;
`tpu_jobs.launch` starts several local processes), recording through `RcpHooks`; runs
``--max-steps`` updates unless a stop request for this run stands (checked after each step), and
a rerun with the same flags resumes from the newest complete checkpoint (``--resume-past-corrupt``
drops a newest one that cannot be restored). Prints one JSON line per update; exit codes:
docs/tpu_jobs.md (0 done, 2 bad flags, 1 a run folder that cannot be resumed, 143 on SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from rcpflow import recipe
from rcpflow.records.mllog import SystemInfo
from rcpflow.trainer.job_exit import EXIT_SIGTERM
from rcpflow.trainer.recorder import now_ms
from tpu_jobs.rcp import distributed, job_cli, job_errors, sharding, termination
from tpu_jobs.rcp.callbacks import (
    FULL_STATE_EVERY_FLAG,
    KEEP_FULL_STATES_FLAG,
    RESUME_PAST_CORRUPT_FLAG,
    RcpHooks,
)
from tpu_jobs.rcp.job_cli import RunConfig, TrainResult, say
from tpu_jobs.rcp.trainer_hooks import TrainerHooks
from tpu_jobs.toy import grpo
from tpu_jobs.toy.model import MODEL_CONFIG_KEY, ModelConfig

PROG = "python -m tpu_jobs.train"


# Test hook (the straggler test): "<process>:<seconds>" makes that process sleep after each
# update is computed, before its recording, as a slow host would.
SLOW_AFTER_UPDATE_ENV = "RCPFLOW_TEST_SLOW_AFTER_UPDATE"
COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


@dataclass(frozen=True)
class TrainConfig(RunConfig):
    # Measured (gbs 256, default model, seeds 0-10): pass@4 > 0.69 on the held-out set after
    # 17-25 updates at 3e-3 (median 21), so with val_start_at 18 most seeds are decided a few
    # evaluated checkpoints in. 2e-3 and 5e-3 also learn (4-head model).
    OPEN_LEARNING_RATE: ClassVar[float] = 3e-3

    max_steps: int = 50
    resume_past_corrupt: bool = False
    model: ModelConfig = field(default_factory=ModelConfig)
    full_state_every: int = 1
    keep_full_states: int | None = None


def _slow_after_update() -> float:
    raw = os.environ.get(SLOW_AFTER_UPDATE_ENV, "")
    if not raw:
        return 0.0
    process, _, seconds = raw.partition(":")
    return float(seconds) if int(process) == jax.process_index() else 0.0


def collectives_in(compiled: jax.stages.Compiled) -> list[str]:
    """The collective ops of a compiled program's HLO (none: every device computes alone)."""
    text = compiled.as_text() or ""
    return [op for op in COLLECTIVE_OPS if f" {op}(" in text or f" {op}-start(" in text]


def train(config: TrainConfig) -> TrainResult:
    hp = config.hyperparameters()
    val_start = recipe.val_start_at(hp.global_batch_size, config.val_start_at)
    cfg = config.model
    mesh = sharding.mesh()
    prompts_per_step = hp.num_prompts_per_step
    sharding.check_batch(mesh, prompts_per_step, "--global-batch-size / 16 prompts")
    hooks: TrainerHooks
    if jax.process_index() == 0:
        hooks = RcpHooks(
            config.run_dir,
            config.seed,
            hp,
            val_start,
            rcp_logging=config.rcp_logging,
            # One update consumes the whole global batch at once, split over the devices.
            system=SystemInfo(micro_batch_size=hp.global_batch_size // mesh.devices.size),
            checkpoint_extra={MODEL_CONFIG_KEY: asdict(cfg)},
            full_state_every=config.full_state_every,
            keep_full_states=config.keep_full_states,
        )
    else:  # one writer of the log and manifest; every process saves its shards
        hooks = distributed.FollowerHooks(
            config.run_dir, val_start, full_state_every=config.full_state_every
        )
    # Each leaf is created where it lives: no process holds the whole model.
    init = partial(grpo.init_state, cfg, hp, config.seed)
    state_shardings = sharding.tree_shardings(mesh, jax.eval_shape(init))
    replicated = sharding.replicated(mesh)
    state = jax.jit(init, out_shardings=state_shardings)()
    resumed = distributed.resume(
        hooks,
        params_like=state.params,
        state_like=state.opt_state,
        past_corrupt=config.resume_past_corrupt,
    )
    first_step = 1
    if resumed is not None:
        step0 = jax.jit(lambda: jnp.int32(resumed.step), out_shardings=replicated)()
        state = grpo.TrainState(step=step0, params=resumed.params, opt_state=resumed.state)
        # A run whose log already ended only gets its last rows checked by on_train_end().
        first_step = hp.max_steps + 1 if resumed.finished else resumed.step + 1
    hooks.on_init_start()
    start_row, stop_row = sharding.local_rows(mesh, prompts_per_step)

    def batch(step: int) -> tuple[jax.Array, jax.Array]:
        # This process's rows only: the global batch is assembled from every process's part.
        mine = grpo.prompts_for_step(hp, config.seed, step)[start_row:stop_row]
        prompts = sharding.global_batch(mesh, mine, prompts_per_step)
        step_array = jax.make_array_from_process_local_data(replicated, np.int32(step), ())
        return prompts, step_array

    # Compile before run_start: initialisation is not time-to-train.
    step_fn = (
        grpo.sharded_train_step(cfg, hp, config.seed, state_shardings, replicated)
        .lower(state, *batch(first_step))
        .compile()
    )
    start = job_cli.start_event(hp, val_start, None if resumed is None else resumed.step)
    say(
        {
            **start,
            "process": [jax.process_index(), jax.process_count()],
            "rows": [start_row, stop_row],
            "collectives": collectives_in(step_fn),
        }
    )
    slow_s = _slow_after_update()
    hooks.on_run_start()
    rewards: list[float] = []
    last_step = min(first_step - 1, hp.max_steps)
    with hooks, termination.deferred() as sigterm:
        for step in range(first_step, hp.max_steps + 1):
            started = time.perf_counter()
            state, metrics = step_fn(state, *batch(step))
            # This process's part of the update is done here; what follows is recording (its
            # wait for the other processes' parts included).
            jax.block_until_ready(state.params)
            computed = time.perf_counter()
            waited_before = hooks.save_wait_s
            if slow_s:
                time.sleep(slow_s)
                say({"event": "slow_update_done", "step": step, "time_ms": now_ms(),
                     "process": jax.process_index()})  # fmt: skip
            timestamp_ms = hooks.after_update(step, state.params, state.opt_state)
            decision = distributed.stop_decision(hooks, bool(sigterm))
            recorded = time.perf_counter()
            rewards.append(float(metrics.mean_reward))
            say(
                {
                    "step": step,
                    "mean_reward": round(rewards[-1], 4),
                    "loss": round(float(metrics.loss), 6),
                    "timestamp_ms": timestamp_ms,
                    "step_s": round(computed - started, 4),
                    "recording_s": round(recorded - computed, 4),
                    "save_wait_s": round(hooks.save_wait_s - waited_before, 4),
                    **({"process": jax.process_index()} if jax.process_count() > 1 else {}),
                }
            )
            last_step = step
            if decision.terminated:
                say({"event": "sigterm", "step": step, "process": jax.process_index()})
                raise termination.Terminated(EXIT_SIGTERM)
            if decision.stop:
                say({"event": "stop_requested", "step": step, "process": jax.process_index()})
                break
        hooks.on_train_end()
    return TrainResult(
        first_step=first_step,
        last_step=last_step,
        resumed_from=None if resumed is None else resumed.step,
        mean_rewards=tuple(rewards),
    )


def parse_args(argv: Sequence[str] | None) -> TrainConfig:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    job_cli.add_run_flags(parser, TrainConfig)
    for name, what in (
        (
            "d_model",
            "policy width (default %(default)s; recorded in each checkpoint for the evaluator)",
        ),
        ("d_ff", "feed-forward width (default %(default)s)"),
        ("num_layers", "decoder layers (default %(default)s)"),
    ):
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=int, default=getattr(ModelConfig, name), help=what)
    parser.add_argument(
        RESUME_PAST_CORRUPT_FLAG,
        action="store_true",
        help="when the newest checkpoint cannot be restored, delete it (and its manifest row) "
        "and train that step again from the one before (one process only)",
    )
    parser.add_argument(
        FULL_STATE_EVERY_FLAG,
        type=int,
        default=1,
        metavar="K",
        help="save the full train state (for resume) every K checkpointed steps from "
        "val_start_at; the others hold the weights only (default %(default)s: every step)",
    )
    parser.add_argument(
        KEEP_FULL_STATES_FLAG,
        type=int,
        default=None,
        metavar="N",
        help="keep the train state of the last N full-state steps only (their weights stay "
        "for evaluation; default: keep all)",
    )

    def build(args: argparse.Namespace) -> TrainConfig:
        try:
            model = ModelConfig(d_model=args.d_model, d_ff=args.d_ff, num_layers=args.num_layers)
        except ValueError as e:
            parser.error(f"--d-model/--d-ff/--num-layers: {e}")
        if args.full_state_every < 1:
            parser.error(f"{FULL_STATE_EVERY_FLAG} must be >= 1, got {args.full_state_every}")
        if args.keep_full_states is not None and args.keep_full_states < 1:
            parser.error(f"{KEEP_FULL_STATES_FLAG} must be >= 1, got {args.keep_full_states}")
        return TrainConfig(
            **job_cli.run_fields(args),
            resume_past_corrupt=args.resume_past_corrupt,
            model=model,
            full_state_every=args.full_state_every,
            keep_full_states=args.keep_full_states,
        )

    return job_cli.parse_run_args(parser, argv, build)


def _drop_closed_loop_callbacks() -> None:
    """A restore that fails part-way (a corrupt checkpoint) leaves tensorstore reads in flight;
    as they finish they call back into the asyncio loop Orbax has already closed, and Python
    prints each as an unraisable RuntimeError traceback; the reads' own failures asyncio logs
    (`AbandonedRestoreReads`). They say nothing the one-line error does not; every other
    unraisable exception and asyncio record is still reported."""
    previous = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        e = unraisable.exc_value
        if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
            return
        previous(unraisable)

    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(AbandonedRestoreReads())


class AbandonedRestoreReads(logging.Filter):
    """The same reads seen from the other side: a restore that fails part-way gathers several
    Orbax deserializations, raises the first failure (the one-line error) and abandons the
    others; asyncio logs each abandoned failure with its traceback ("Task exception was never
    retrieved") when its task is collected. Only those raised inside Orbax's checkpoint code are
    dropped, and tensorstore reads that Orbax handed asyncio as they are (their traceback holds
    asyncio's frames alone; their error names the tensorstore spec); every other asyncio record
    is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Task exception was never retrieved"):
            return True
        error = record.exc_info[1] if record.exc_info else None
        tb = record.exc_info[2] if record.exc_info else None
        files = [f.filename for f in traceback.extract_tb(tb)] if tb is not None else []
        if any(ORBAX_CHECKPOINT_CODE in f for f in files):
            return False
        bare_read = bool(files) and all(f.startswith(ASYNCIO_CODE) for f in files)
        return not (bare_read and TENSORSTORE_ERROR_MARK in str(error))


# Where Orbax's checkpoint code lives in a traceback's file names.
ORBAX_CHECKPOINT_CODE = f"{os.sep}orbax{os.sep}checkpoint{os.sep}"
# asyncio's own files, and what every tensorstore read error carries.
ASYNCIO_CODE = os.path.dirname(asyncio.__file__) + os.sep
TENSORSTORE_ERROR_MARK = "[tensorstore_spec="


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    _drop_closed_loop_callbacks()
    try:
        layout = distributed.layout_from_env()
    except distributed.LayoutError as e:
        return job_errors.report(PROG, e)
    distributed.initialize(layout)
    # SIGTERM (preemption, eviction) unwinds like a crash: the queued saves finish first.
    termination.exit_on_sigterm()
    return job_cli.run_job(PROG, config, train)


if __name__ == "__main__":
    sys.exit(main())
