"""The Tunix GRPO training job (``python -m tpu_jobs.tunix_train --run-dir D --seed S [...]``).

Tunix's own ``RLCluster`` + ``GRPOLearner`` (rollout engine "vanilla", one ``("fsdp", "tp")``
mesh, no reference model) train a small Tunix Qwen3 (`tpu_jobs.tunix.policy`) on the digit task;
recording rides on Tunix's checkpoint-metadata call (`tpu_jobs.tunix.recording`), Tunix saves
the checkpoints (`tpu_jobs.tunix.checkpoints`). The run flags and exit codes are the toy
trainer's (`tpu_jobs.rcp.job_cli`); stop requests, resume and the known costs: docs/tpu_jobs.md.
Every check of the run folder comes before its first write.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, ClassVar

import jax
import numpy as np
from tunix.rl import rl_cluster as rlc
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout

from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.records.run_identity import RunIdentity
from tpu_jobs import task
from tpu_jobs.rcp import collectives, distributed, job_cli, job_errors
from tpu_jobs.rcp.callbacks import resume_committed
from tpu_jobs.rcp.checkpoint_format import CheckpointError
from tpu_jobs.rcp.job_cli import RunConfig, TrainResult, say
from tpu_jobs.rcp.optimizer import make_optimizer
from tpu_jobs.tunix import checkpoints, policy, vocab
from tpu_jobs.tunix.recording import StepRecording, committed_checkpoints

GRPO_EPSILON = 0.2
ROLLOUT_SEED_STRIDE = 1_000_003
PROG = "python -m tpu_jobs.tunix_train"


@dataclass(frozen=True)
class TrainConfig(RunConfig):
    # Measured on CPU (gbs 256, ModelConfig(), seeds 0-2): pass@4 > 0.69 after ~20 updates.
    OPEN_LEARNING_RATE: ClassVar[float] = 3e-3

    max_steps: int = 60
    policy: policy.ModelConfig = field(default_factory=policy.ModelConfig)


def run_identity(config: TrainConfig, hp: recipe.Hyperparameters, val_start: int) -> RunIdentity:
    """What this run's checkpoints record about it (its `RunIdentity.arguments`)."""
    return RunIdentity.of_run(config.seed, hp, val_start)


def batches(
    seed: int, hp: recipe.Hyperparameters, rollout: base_rollout.RolloutConfig
) -> Iterator[dict[str, np.ndarray]]:
    """Step k's prompts (a function of seed and k); Tunix skips the ones a resume has done.

    The rollout's sampling seed is set per step as its batch is drawn (Tunix draws the batch
    right before that step's rollout), so the rollouts differ from step to step and a resumed
    run samples step k as the first run would have.
    """
    for step in range(1, hp.max_steps + 1):
        rollout.seed = seed * ROLLOUT_SEED_STRIDE + step
        yield vocab.batch(seed, step, hp.num_prompts_per_step)


@dataclass(eq=False)  # hashed and compared by identity, as any iterable handed to Tunix
class StoppableBatches:
    """`batches` for ``learner.train``, ending early once the run's stop request stands.

    Tunix draws step k+1's prompts after update k has been recorded (its checkpoint queued), so
    the check before each draw is the check after each update. The steps a resumed run
    fast-forwards over (up to `resumed_from`) are drawn without a check: they were trained
    before. `stopped_after` is the last update when the request ended training, else None.
    """

    seed: int
    hp: recipe.Hyperparameters
    rollout: base_rollout.RolloutConfig
    _: KW_ONLY
    resumed_from: int
    stop_requested: Callable[[], bool]
    stopped_after: int | None = field(default=None, init=False)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        drawn = batches(self.seed, self.hp, self.rollout)
        for step in range(1, self.hp.max_steps + 1):
            done = step - 1
            if done > self.resumed_from and self.stop_requested():
                self.stopped_after = done
                say({"event": "stop_requested", "step": done})
                return  # Tunix ends training on the exhausted iterator
            yield next(drawn)


@dataclass(frozen=True)
class Job:
    """Tunix's pieces of one run, built and wired, not yet trained."""

    cluster: rlc.RLCluster
    trainer: Any  # the actor's tunix.rl.trainer.Trainer
    learner: grpo_learner.GRPOLearner
    rollout: base_rollout.RolloutConfig


def build_job(
    config: TrainConfig, hp: recipe.Hyperparameters, val_start: int, root: str | None
) -> Job:
    """RLCluster + GRPOLearner; `root` None: no checkpoints at all (for the bench's baseline).
    With checkpoints, Tunix restores the newest committed one of `root` here."""
    mesh = policy.mesh()
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=task.ANSWER_LENGTH,
        temperature=hp.train_temperature,
        top_p=hp.train_top_p,
        top_k=None,
        max_prompt_length=task.PROMPT_LENGTH,
        kv_cache_size=task.PROMPT_LENGTH + task.ANSWER_LENGTH + 1,
        eos_tokens=[vocab.EOS],
    )
    training = rlc.RLTrainingConfig(
        actor_optimizer=make_optimizer(hp),
        eval_every_n_steps=hp.max_steps + 1,  # no Tunix-side eval: evaluation is offline
        max_steps=hp.max_steps,
        checkpoint_root_directory=root,
        checkpointing_options=None
        if root is None
        else checkpoints.options(val_start, hp.max_steps),
        pbar_description=None,
    )
    cluster = rlc.RLCluster(
        actor=policy.build(config.policy, config.seed),
        reference=None,
        tokenizer=vocab.DigitTokenizer(),
        cluster_config=rlc.ClusterConfig(
            role_to_mesh={rlc.Role.ACTOR: mesh, rlc.Role.REFERENCE: mesh, rlc.Role.ROLLOUT: mesh},
            rollout_engine="vanilla",
            offload_to_cpu=False,
            training_config=training,
            rollout_config=rollout,
        ),
    )
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster,
        algo_config=grpo_learner.GRPOConfig(
            num_generations=hp.num_generations_per_prompt,
            num_iterations=1,
            beta=0.0,
            epsilon=GRPO_EPSILON,
        ),
        reward_fns=vocab.exact_match_reward,
    )
    return Job(cluster=cluster, trainer=cluster.actor_trainer, learner=learner, rollout=rollout)


def train(config: TrainConfig) -> TrainResult:
    hp = config.hyperparameters()
    val_start = recipe.val_start_at(hp.global_batch_size, config.val_start_at)
    layout = RunLayout(config.run_dir)
    root = layout.checkpoints_dir
    identity = run_identity(config, hp, val_start)
    recorder = job_cli.run_recorder(config, hp, val_start)
    # One recorder: process 0's (every process trains and saves its shards).
    primary = jax.process_index() == 0
    committed = {c.step: c for c in committed_checkpoints(root, identity, val_start)}
    resumed = None
    if primary:
        resumed = resume_committed(
            recorder, committed, path_of=lambda step: checkpoints.step_path(root, step)
        )
    # The log already has its block_stop (a finished or stopped run started again): no training.
    [ended_flag] = collectives.from_primary([int(resumed is not None and resumed.finished)])
    ended = bool(ended_flag)

    def stop_requested() -> bool:  # process 0 reads it; every process stops at the same step
        return collectives.any_process([primary and recorder.stop_requested()])[0]

    if primary:
        recorder.on_init_start()
    job = build_job(config, hp, val_start, root)
    cluster, trainer, learner, rollout = job.cluster, job.trainer, job.learner, job.rollout
    restored = max(committed, default=0)
    if trainer.train_steps != restored:
        raise CheckpointError(
            f"Tunix restored step {trainer.train_steps}, the newest committed checkpoint is "
            f"step {restored}"
        )
    recording = StepRecording(
        recorder,
        trainer,
        val_start_at=val_start,
        checkpoint_root=root,
        identity=identity,
        policy_config=config.policy,
        last_step=restored,
        primary=primary,
    )
    say(
        {
            **job_cli.start_event(hp, val_start, restored or None),
            "trainer": "tunix",
            "process": [jax.process_index(), jax.process_count()],
        }
    )
    if primary:
        recorder.on_run_start()
    source = StoppableBatches(
        config.seed, hp, rollout, resumed_from=restored, stop_requested=stop_requested
    )
    stopped_before = restored < hp.max_steps and not ended and stop_requested()
    if stopped_before:  # the request came before the crash this run resumes from
        say({"event": "stop_requested", "step": restored})
    try:
        if restored < hp.max_steps and not ended and not stopped_before:
            learner.train(source)  # closes Tunix's checkpointer: its queued saves finish
        else:
            cluster.close()
    finally:
        recording.finish()
    last = trainer.train_steps
    if last != hp.max_steps and not (ended or stopped_before or source.stopped_after == last):
        raise CheckpointError(
            f"Tunix stopped at step {last} of {hp.max_steps}, and no stop request for this run "
            "asked it to"
        )
    if primary:
        recorder.on_train_end()
    return TrainResult(first_step=restored + 1, last_step=last, resumed_from=restored or None)


def parse_args(argv: Sequence[str] | None) -> TrainConfig:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    job_cli.add_run_flags(parser, TrainConfig)
    return job_cli.parse_run_args(
        parser, argv, lambda args: TrainConfig(**job_cli.run_fields(args))
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        layout = distributed.layout_from_env()
    except distributed.LayoutError as e:
        return job_errors.report(PROG, e)
    distributed.initialize(layout)  # several processes: one system, process 0 records
    return job_cli.run_job(PROG, config, train)
