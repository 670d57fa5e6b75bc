"""The Tunix GRPO training job: ``python -m tpu_jobs.tunix_train --run-dir D --seed S [...]``.

Tunix's own ``RLCluster`` + ``GRPOLearner`` (rollout engine "vanilla", actor and rollout sharing
one model on one ``("fsdp", "tp")`` mesh, no reference model: beta 0) train a small Tunix Qwen3
(`tpu_jobs.tunix.policy`) on the toy digit task (`tpu_jobs.task`, through the in-memory
tokenizer of `tpu_jobs.tunix.vocab`), 16 generations per prompt, ``gbs = prompts x 16``, one
generated token. Same flags as ``python -m tpu_jobs.train`` (its docstring has them); open
division defaults to the learning rate that learns here (`OPEN_LEARNING_RATE`), closed division
runs the recipe's (on which the toy does not learn); what is used is what is logged.

Checkpoints are Tunix's (`tpu_jobs.tunix.checkpoints`): its checkpoint manager saves every step
from ``val_start_at`` to ``max_steps`` under ``D/checkpoints/actor/<step>/`` asynchronously, none
before, none deleted. RCP recording rides on the one call Tunix makes between an update and the
save of its result, ``custom_checkpoint_metadata_fn`` (`StepRecording`): once per update it
blocks on the actor's new parameters, takes the update's timestamp (after the update completed,
before the next step's rollout starts; ``on_train_step_end`` would be a step late), and from
``val_start_at`` on puts the step's record (timestamp, weights fingerprint, run identity) into
the checkpoint's custom metadata. A watcher thread writes the manifest row once Orbax has
committed the step, so the loop never waits for a write or a row. The MLLOG training section and
the backdated ``block_stop`` come from the recorder.

Stop at the verdict: training runs ``max_steps`` updates unless the orchestrator asks the run to
stop (`rcpflow.stop_request`). After each update, when Tunix asks for the next step's prompts,
`StoppableBatches` asks the recorder (`TrainingRecorder.stop_requested`: one existence check
when there is no request; a request for another run, or for a step this run has not committed
with that weight-update time, is ignored). When it stands the iterator ends: Tunix 0.1.7 takes
the exhausted iterator as the end of training (its loop breaks on the StopIteration, no further
update or save), closes its checkpoint manager, which finishes the queued async saves, the
watcher writes the row of every committed step, and the recorder logs ``block_stop`` at the
last update. A rerun that finds the request standing (or the log already ended) trains nothing
more. Training that ends before ``max_steps`` without a request is an error.

Resume: a rerun after a crash (SIGKILL included) finds the newest committed checkpoint; Tunix
restores it (weights, optimizer state, its global step) and skips the data of the done steps;
the recorder first rebuilds any missing row from the committed checkpoints' records (rows are
keyed by step: never a duplicate) and continues the log (one ``run_start``). A crash before
``val_start_at`` left no checkpoint: the rerun starts afresh.

Known cost: Tunix compiles its programs lazily, in the first step, so compilation falls inside
the timed run (after ``run_start``), unlike the toy trainer's.

Prints one JSON line per update (and ``{"event": "stop_requested", "step": N}`` when a stop
request ends training after update N) and exits 0 when training finished; like the toy trainer
(`tpu_jobs.job_errors`), 2 on bad arguments (the message names the flag; also arguments that are
not those of the run whose checkpoints are in the run folder), 1 when the run folder cannot be
resumed as it is (a lost or cut MLLOG, a deleted checkpoint, a garbage manifest line, a run_dir
that is a file or cannot be written), one line each, and the folder left as it was: every such
check comes before the first write.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from tunix.rl import rl_cluster as rlc
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout

from rcpflow import recipe
from rcpflow.layout import RunLayout, join
from rcpflow.mllog import SystemInfo, require_mlperf_logging
from rcpflow.recorder import TrainingRecorder
from tpu_jobs import job_errors, task
from tpu_jobs.checkpoint import CheckpointError
from tpu_jobs.fingerprint import weights_fingerprint
from tpu_jobs.rcp_hooks import Committed, resume_recorder, run_mismatch
from tpu_jobs.tunix import checkpoints, policy, vocab

DEFAULT_GLOBAL_BATCH_SIZE = 256
DEFAULT_MAX_STEPS = 60
DEFAULT_DIVISION = "open"
# Measured on CPU (gbs 256, PolicyConfig(), seeds 0-2): pass@4 > 0.69 after ~20 updates at 3e-3.
OPEN_LEARNING_RATE = 3e-3
CHECKPOINT_ROOT = "checkpoints"  # under the run dir; Tunix adds actor/<step>
GRPO_EPSILON = 0.2
ROLLOUT_SEED_STRIDE = 1_000_003
PROG = "python -m tpu_jobs.tunix_train"


def _say(record: dict[str, object]) -> None:
    print(json.dumps(record, sort_keys=True), flush=True)


@dataclass(frozen=True)
class TrainConfig:
    run_dir: str
    seed: int
    global_batch_size: int = DEFAULT_GLOBAL_BATCH_SIZE
    max_steps: int = DEFAULT_MAX_STEPS
    val_start_at: int | None = None
    division: recipe.Division = DEFAULT_DIVISION
    learning_rate: float | None = None
    rcp_logging: bool = True
    policy: policy.PolicyConfig = field(default_factory=policy.PolicyConfig)


@dataclass(frozen=True)
class TrainResult:
    first_step: int
    last_step: int
    resumed_from: int | None


def hyperparameters_for(config: TrainConfig) -> recipe.Hyperparameters:
    lr = config.learning_rate
    if config.division == "open" and lr is None:
        lr = OPEN_LEARNING_RATE
    return recipe.hyperparameters(
        config.division, config.global_batch_size, config.max_steps, learning_rate=lr
    )


def optimizer(hp: recipe.Hyperparameters) -> optax.GradientTransformation:
    """The recipe's AdamW (constant lr, no warmup, no weight decay) after global-norm clipping."""
    return optax.chain(
        optax.clip_by_global_norm(hp.gradient_clip_norm),
        optax.adamw(
            hp.learning_rate,
            b1=hp.adam_beta_1,
            b2=hp.adam_beta_2,
            eps=hp.adam_epsilon,
            weight_decay=hp.weight_decay,
        ),
    )


def run_identity(config: TrainConfig, hp: recipe.Hyperparameters, val_start: int) -> dict[str, int]:
    return {
        "seed": config.seed,
        "global_batch_size": hp.global_batch_size,
        "val_start_at": val_start,
        "max_steps": hp.max_steps,
    }


class StepRecording:
    """RCP recording inside Tunix's loop, on the actor trainer's checkpoint-metadata call.

    Tunix calls ``custom_checkpoint_metadata_fn`` twice per update: before dispatching it (perf
    tags; ``train_steps`` still the previous step's) and right after (as the argument of the save;
    ``train_steps`` already the new step's). The first call that sees a new ``train_steps`` is
    the second one: there the update is recorded.
    """

    def __init__(
        self,
        recorder: TrainingRecorder,
        trainer: Any,
        *,
        val_start_at: int,
        checkpoint_root: str,
        identity: dict[str, int],
        policy_config: policy.PolicyConfig,
        last_step: int,
    ) -> None:
        self.recorder = recorder
        self.trainer = trainer
        self.val_start_at = val_start_at
        self.identity = identity
        self.policy_config = policy_config
        self._tunix_metadata = trainer.custom_checkpoint_metadata_fn
        self._last_step = last_step
        self._current: dict[str, Any] = {}
        self._records: dict[int, checkpoints.CheckpointRecord] = {}
        self.watcher = checkpoints.CommitWatcher(checkpoint_root, self._committed)
        trainer.custom_checkpoint_metadata_fn = self._metadata

    def _metadata(self) -> dict[str, Any]:
        base = dict(self._tunix_metadata())  # Tunix's own global_step and role stay as they are
        step = self.trainer.train_steps
        if step != self._last_step:
            self._record_update(step)
        return {**base, **self._current}

    def _record_update(self, step: int) -> None:
        if step != self._last_step + 1:
            raise CheckpointError(f"step {step}: Tunix skipped from update {self._last_step}")
        actor = nnx.state(self.trainer.model, nnx.Param)
        jax.block_until_ready(actor)
        timestamp_ms = self.recorder.on_update(step)
        self._last_step = step
        _say({"step": step, "timestamp_ms": timestamp_ms})  # progress, as the update happens
        self._current = {}
        if step >= self.val_start_at:
            record = checkpoints.CheckpointRecord(
                step=step,
                timestamp_ms=timestamp_ms,
                weights_fingerprint=weights_fingerprint(policy.params(self.trainer.model)),
                run=self.identity,
                policy=self.policy_config.to_json(),
            )
            self._records[step] = record
            self._current = {checkpoints.RCPFLOW_KEY: record.to_json()}
            self.watcher.expect(step)

    def _committed(self, step: int, path: str) -> None:
        _, found = checkpoints.read_record(path)
        if found != self._records[step]:
            raise CheckpointError(f"step {step}: {path} records {found}, not {self._records[step]}")
        self.recorder.on_checkpoint_committed(
            step, path, extra={"weights_fingerprint": found.weights_fingerprint}
        )

    def finish(self) -> None:
        """Wait for the rows of every saved step (Tunix's close has waited for the writes)."""
        try:
            self.watcher.drain()
        finally:
            self.watcher.close()


def committed_checkpoints(root: str, identity: dict[str, int], val_start: int) -> list[Committed]:
    """This run's committed checkpoints, ascending; one of another run is an error."""
    found = []
    for step in checkpoints.complete_steps(root):
        path = checkpoints.step_path(root, step)
        global_step, record = checkpoints.read_record(path)
        if record.run != identity:
            raise run_mismatch(step, path, dict(record.run), identity)
        if record.step != step or global_step != step or step < val_start:
            raise CheckpointError(
                f"step {step}: {path} records step {record.step} (Tunix global_step "
                f"{global_step}); one optimizer update per global step is this job's contract"
            )
        found.append(
            Committed(
                step=step,
                path=path,
                timestamp_ms=record.timestamp_ms,
                weights_fingerprint=record.weights_fingerprint,
            )
        )
    return found


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


class StoppableBatches:
    """`batches` for ``learner.train``, ending early once the run's stop request stands.

    Tunix draws step k+1's prompts after update k has been recorded (its checkpoint queued), so
    the check before each draw is the check after each update. The steps a resumed run
    fast-forwards over (up to `resumed_from`) are drawn without a check: they were trained
    before. `stopped_after` is the last update when the request ended training, else None.
    """

    def __init__(
        self,
        seed: int,
        hp: recipe.Hyperparameters,
        rollout: base_rollout.RolloutConfig,
        *,
        resumed_from: int,
        stop_requested: Callable[[], bool],
    ) -> None:
        self.seed = seed
        self.hp = hp
        self.rollout = rollout
        self.resumed_from = resumed_from
        self._stop_requested = stop_requested
        self.stopped_after: int | None = None

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        drawn = batches(self.seed, self.hp, self.rollout)
        for step in range(1, self.hp.max_steps + 1):
            done = step - 1
            if done > self.resumed_from and self._stop_requested():
                self.stopped_after = done
                _say({"event": "stop_requested", "step": done})
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
        actor_optimizer=optimizer(hp),
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
    hp = hyperparameters_for(config)
    val_start = recipe.val_start_at(hp.global_batch_size, config.val_start_at)
    layout = RunLayout(config.run_dir)
    root = join(layout.root, CHECKPOINT_ROOT)
    identity = run_identity(config, hp, val_start)
    recorder = TrainingRecorder(
        config.run_dir,
        seed=config.seed,
        hyperparameters=hp,
        val_start_at=val_start,
        system=SystemInfo(micro_batch_size=hp.global_batch_size),
        rcp_logging=config.rcp_logging,
    )
    committed = {c.step: c for c in committed_checkpoints(root, identity, val_start)}
    resumed = None
    if committed:
        resumed = resume_recorder(
            recorder,
            sorted(committed),
            path_of=lambda step: checkpoints.step_path(root, step),
            committed=committed.__getitem__,
        )
    # The log already has its block_stop (a finished or stopped run started again): no training.
    ended = resumed is not None and resumed.finished
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
    )
    _say(
        {
            "event": "start",
            "trainer": "tunix",
            "resumed_from": restored or None,
            "division": hp.division,
            "learning_rate": hp.learning_rate,
            "gradient_clip_norm": hp.gradient_clip_norm,
            "global_batch_size": hp.global_batch_size,
            "val_start_at": val_start,
            "max_steps": hp.max_steps,
            "devices": [str(d) for d in jax.devices()],
        }
    )
    recorder.on_run_start()
    source = StoppableBatches(
        config.seed, hp, rollout, resumed_from=restored, stop_requested=recorder.stop_requested
    )
    stopped_before = restored < hp.max_steps and not ended and recorder.stop_requested()
    if stopped_before:  # the request came before the crash this run resumes from
        _say({"event": "stop_requested", "step": restored})
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
    recorder.on_train_end()
    return TrainResult(first_step=restored + 1, last_step=last, resumed_from=restored or None)


def parse_args(argv: Sequence[str] | None) -> TrainConfig:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="local folder or gs://bucket/prefix")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--global-batch-size", type=int, default=DEFAULT_GLOBAL_BATCH_SIZE)
    parser.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS)
    parser.add_argument("--val-start-at", type=int, default=None)
    parser.add_argument("--division", choices=recipe.DIVISIONS, default=DEFAULT_DIVISION)
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help=f"open division only (default {OPEN_LEARNING_RATE}); closed uses the recipe's",
    )
    parser.add_argument("--rcp-logging", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    if args.val_start_at is not None and args.val_start_at <= 0:
        parser.error(f"--val-start-at must be positive, got {args.val_start_at}")
    config = TrainConfig(
        run_dir=args.run_dir,
        seed=args.seed,
        global_batch_size=args.global_batch_size,
        max_steps=args.max_steps,
        val_start_at=args.val_start_at,
        division=args.division,
        learning_rate=args.learning_rate,
        rcp_logging=args.rcp_logging,
    )
    try:
        hp = hyperparameters_for(config)
    except ValueError as e:
        parser.error(str(e))
    val_start = recipe.val_start_at(hp.global_batch_size, config.val_start_at)
    if val_start > hp.max_steps:
        parser.error(
            f"--max-steps {hp.max_steps} is below the validation start step {val_start}: "
            "no checkpoint would ever be saved or evaluated"
        )
    return config


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    if config.rcp_logging:
        require_mlperf_logging()
    started = time.monotonic()
    try:
        result = train(config)
    except job_errors.USER_ERRORS as e:
        return job_errors.report(PROG, e)
    _say(
        {
            "event": "done",
            "first_step": result.first_step,
            "last_step": result.last_step,
            "resumed_from": result.resumed_from,
            "wall_s": round(time.monotonic() - started, 2),
        }
    )
    return 0
