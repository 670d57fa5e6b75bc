"""The toy GRPO training job (``python -m tpu_jobs.train --run-dir D --seed S [...]``).

Trains the toy policy on the digit task with GRPO, recording through `RcpHooks`; runs
``--max-steps`` updates unless a stop request for this run stands (checked after each step), and
a rerun with the same flags resumes from the newest complete checkpoint (``--resume-past-corrupt``
drops a newest one that cannot be restored). Prints one JSON line per update; exit codes:
docs/tpu_jobs.md (0 done, 2 bad flags, 1 a run folder that cannot be resumed, 143 on SIGTERM).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import jax
import jax.numpy as jnp

from rcpflow import recipe
from rcpflow.mllog import SystemInfo
from tpu_jobs.rcp import distributed, job_cli, job_errors, termination
from tpu_jobs.rcp.hooks import RESUME_PAST_CORRUPT_FLAG, RcpHooks
from tpu_jobs.rcp.job_cli import RunConfig, TrainResult, say
from tpu_jobs.rcp.trainer_hooks import TrainerHooks
from tpu_jobs.toy import grpo
from tpu_jobs.toy.model import MODEL_CONFIG_KEY, ModelConfig

PROG = "python -m tpu_jobs.train"


@dataclass(frozen=True)
class TrainConfig(RunConfig):
    # Measured (gbs 256, default model, seeds 0-10): pass@4 > 0.69 on the held-out set after
    # 17-25 updates at 3e-3 (median 21), so with val_start_at 18 most seeds are decided a few
    # evaluated checkpoints in. 2e-3 and 5e-3 also learn (4-head model).
    OPEN_LEARNING_RATE: ClassVar[float] = 3e-3

    max_steps: int = 50
    resume_past_corrupt: bool = False
    model: ModelConfig = field(default_factory=ModelConfig)


def train(config: TrainConfig) -> TrainResult:
    hp = config.hyperparameters()
    val_start = recipe.val_start_at(hp.global_batch_size, config.val_start_at)
    cfg = config.model
    hooks: TrainerHooks
    if jax.process_index() == 0:
        hooks = RcpHooks(
            config.run_dir,
            config.seed,
            hp,
            val_start,
            rcp_logging=config.rcp_logging,
            # One update consumes the whole global batch at once on one device.
            system=SystemInfo(micro_batch_size=hp.global_batch_size),
            checkpoint_extra={MODEL_CONFIG_KEY: asdict(cfg)},
        )
    else:  # one writer: the other processes of a multi-process job write nothing
        hooks = distributed.FollowerHooks(config.run_dir)
    state = grpo.init_state(cfg, hp, config.seed)
    resumed = distributed.resume(
        hooks,
        params_like=state.params,
        state_like=state.opt_state,
        past_corrupt=config.resume_past_corrupt,
    )
    first_step = 1
    if resumed is not None:
        state = grpo.TrainState(
            step=jnp.int32(resumed.step), params=resumed.params, opt_state=resumed.state
        )
        # A run whose log already ended only gets its last rows checked by on_train_end().
        first_step = hp.max_steps + 1 if resumed.finished else resumed.step + 1
    state = distributed.replicate(state)
    hooks.on_init_start()
    start = job_cli.start_event(hp, val_start, None if resumed is None else resumed.step)
    say({**start, "process": [jax.process_index(), jax.process_count()]})
    # Compile before run_start: initialisation is not time-to-train.
    step_fn = (
        grpo.make_train_step(cfg, hp)
        .lower(
            state,
            distributed.replicate(grpo.prompts_for_step(hp, config.seed, first_step)),
            distributed.replicate(grpo.rollout_key(config.seed, first_step)),
        )
        .compile()
    )
    hooks.on_run_start()
    rewards: list[float] = []
    last_step = min(first_step - 1, hp.max_steps)
    with hooks:
        for step in range(first_step, hp.max_steps + 1):
            state, metrics = step_fn(
                state,
                distributed.replicate(grpo.prompts_for_step(hp, config.seed, step)),
                distributed.replicate(grpo.rollout_key(config.seed, step)),
            )
            timestamp_ms = hooks.after_update(step, state.params, state.opt_state)
            rewards.append(float(metrics.mean_reward))
            say(
                {
                    "step": step,
                    "mean_reward": round(rewards[-1], 4),
                    "loss": round(float(metrics.loss), 6),
                    "timestamp_ms": timestamp_ms,
                }
            )
            last_step = step
            if distributed.stop_requested(hooks):
                say({"event": "stop_requested", "step": step})
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
    parser.add_argument(
        "--d-model",
        type=int,
        default=ModelConfig.d_model,
        help="policy width (default %(default)s; recorded in each checkpoint for the evaluator)",
    )
    parser.add_argument(
        "--d-ff",
        type=int,
        default=ModelConfig.d_ff,
        help="feed-forward width (default %(default)s)",
    )
    parser.add_argument(
        RESUME_PAST_CORRUPT_FLAG,
        action="store_true",
        help="when the newest checkpoint cannot be restored, delete it (and its manifest row) "
        "and train that step again from the one before",
    )

    def build(args: argparse.Namespace) -> TrainConfig:
        try:
            model = ModelConfig(d_model=args.d_model, d_ff=args.d_ff)
        except ValueError as e:
            parser.error(f"--d-model/--d-ff: {e}")
        return TrainConfig(
            **job_cli.run_fields(args), resume_past_corrupt=args.resume_past_corrupt, model=model
        )

    return job_cli.parse_run_args(parser, argv, build)


def _drop_closed_loop_callbacks() -> None:
    """A restore that fails part-way (a corrupt checkpoint) leaves tensorstore reads in flight;
    as they finish they call back into the asyncio loop Orbax has already closed, and Python
    prints each as an unraisable RuntimeError traceback. They say nothing the one-line error
    does not; every other unraisable exception is still reported."""
    previous = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        e = unraisable.exc_value
        if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
            return
        previous(unraisable)

    sys.unraisablehook = hook


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
