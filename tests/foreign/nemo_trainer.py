"""A NeMo-RL-shaped trainer for tests: NeMo-RL's files (``../shared/reference/nemo-rl.md``), no
rcpflow code, no JAX.

A FIXTURE, not a learner. It writes what NeMo-RL's GRPO trainer in deferred mode writes:
- its own MLLOG through ``$MLPERF_MLLOG_FILE`` with the official ``mlperf_logging.mllog`` API,
  in NeMo-RL's key order (``cache_clear``, ``init_start``, submission keys, seed, max_steps,
  global_batch_size, ..., num_prompts_per_step, num_generations_per_prompt, target_accuracy,
  ``init_stop``, ``run_start``), per step ``block_start`` and ``tracked_stats``
  ``{samples_count, step}`` (loss, reward, grad norm, timings: training lines, not an eval's),
  and at the end ``block_stop`` backdated to the last step's weight update; no ``run_stop``;
- from the validation start, a checkpoint per step: ``tmp_step_<N>/`` renamed to ``step_<N>/``,
  holding ``training_info.json`` (``current_step``, ``consumed_samples`` in prompts,
  ``training_step_end_time_ms``, ``total_valid_tokens``, ``current_epoch``, ``total_steps``),
  ``config.yaml``, ``policy/weights/iter_0000000/common.pt`` (here: the fixture's skill, JSON),
  ``train_dataloader.pt``, ``replay_buffer.pt``.

The skill of step N is ``skill_start + skill_per_step * N`` (clipped to [0, 1]);
`tests/foreign/nemo_evaluator.py` turns it into an accuracy.

    MLPERF_MLLOG_FILE=RUN/mllog/seed_1.out python tests/foreign/nemo_trainer.py \
        --checkpoint-dir CKPT --seed 1 --global-batch-size 16 --max-steps 6 --val-start-at 2 \
        --division open
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import sys
import time

from mlperf_logging.mllog import mllog

from rcpflow import recipe

try:
    from trainer_args import add_run_arguments, skill  # run as a script: tests/foreign on sys.path
except ImportError:
    from foreign.trainer_args import add_run_arguments, skill

WEIGHTS = os.path.join("policy", "weights", "iter_0000000")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def mllogger(path: str) -> mllog.MLLogger:
    """The official logger appending to `path` (mlperf_common's logger does the same)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    logger = logging.Logger(f"nemo-rl-standin.{os.getpid()}")
    handler = logging.FileHandler(path, mode="a")
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    return mllog.MLLogger(logger=logger, default_stack_offset=2)


def training_info(step: int, prompts: int, ts: int) -> dict[str, object]:
    """NeMo-RL's training_info.json: plain values (``.item()``), its keys and types."""
    return {
        "current_step": step,
        "consumed_samples": step * prompts,
        "training_step_end_time_ms": ts,
        "total_valid_tokens": 1024 * step,
        "current_epoch": 0,
        "total_steps": 0,
    }


def save_checkpoint(
    root: str,
    step: int,
    info: dict[str, object],
    content: dict[str, object],
    keep_top_k: int | None = None,
) -> str:
    """``tmp_step_<N>/`` written, then renamed to ``step_<N>/`` (an existing one through
    ``old_step_<N>/``), as NeMo-RL's CheckpointManager does."""
    tmp = os.path.join(root, f"tmp_step_{step}")
    final = os.path.join(root, f"step_{step}")
    os.makedirs(os.path.join(tmp, WEIGHTS), exist_ok=True)
    with open(os.path.join(tmp, WEIGHTS, "common.pt"), "w") as f:
        json.dump(content, f, sort_keys=True)
    for name in ("train_dataloader.pt", "replay_buffer.pt"):
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(b"\0")
    with open(os.path.join(tmp, "config.yaml"), "w") as f:
        # yaml.safe_dump's shape (sorted keys, block style); null keeps every checkpoint
        keep = "null" if keep_top_k is None else keep_top_k
        f.write(f"checkpointing:\n  keep_top_k: {keep}\n  save_optimizer: false\n"
                "grpo:\n  val_period: 0\n")  # fmt: skip
    with open(os.path.join(tmp, "training_info.json"), "w") as f:
        json.dump(info, f)
    if os.path.exists(final):
        old = os.path.join(root, f"old_step_{step}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    if keep_top_k is not None:  # the deferred configuration keeps max(k, 2), the newest
        steps = sorted(int(n[5:]) for n in os.listdir(root) if re.fullmatch(r"step_[0-9]+", n))
        for old_step in steps[: -max(keep_top_k, 2)]:
            shutil.rmtree(os.path.join(root, f"step_{old_step}"))
    return final


def header(
    log: mllog.MLLogger,
    hp: recipe.Hyperparameters,
    seed: int,
    train_samples: int,
    target_accuracy: float = recipe.TARGET_ACCURACY,
) -> None:
    """NeMo-RL's order (mlperf_grpo_logging.py), with the keys the 6.1 rules require."""
    log.event(key="cache_clear", value=True)
    log.start(key="init_start")
    for key, value in (
        ("submission_benchmark", recipe.BENCHMARK),
        ("submission_org", "nemo-rl-standin"),
        ("submission_division", hp.division),
        ("submission_status", "research"),
        ("submission_platform", "rcpflow-local-cpu"),
        ("seed", seed),
        ("max_steps", hp.max_steps),
        ("global_batch_size", hp.global_batch_size),
        ("micro_batch_size", 1),
        ("max_sequence_length", hp.max_sequence_length),
        ("train_samples", train_samples),
        ("eval_samples", hp.eval_samples),
        ("init_checkpoint_step", hp.init_checkpoint_step),
        ("opt_name", recipe.OPTIMIZER),
        ("opt_base_learning_rate", hp.learning_rate),
        ("opt_adamw_beta_1", hp.adam_beta_1),
        ("opt_adamw_beta_2", hp.adam_beta_2),
        ("opt_adamw_epsilon", hp.adam_epsilon),
        ("opt_adamw_weight_decay", hp.weight_decay),
        ("opt_gradient_clip_norm", hp.gradient_clip_norm),
        ("opt_learning_rate_warmup_steps", hp.warmup_steps),
        ("opt_learning_rate_decay_schedule", hp.lr_schedule),
        ("gradient_accumulation_steps", 1),
        ("tensor_parallelism", 1),
        ("pipeline_parallelism", 1),
        ("context_parallelism", 1),
        ("expert_parallelism", 1),
        ("lowest_numerical_precision_in_linear", "bfloat16"),
        ("lowest_numerical_precision_in_attn", "bfloat16"),
        ("lowest_numerical_precision_in_comm", "bfloat16"),
        ("config_filename", "grpo-qwen35-397b.yaml"),
        ("generation_training_rollout_temperature", hp.train_temperature),
        ("generation_training_rollout_top_p", hp.train_top_p),
        ("generation_validation_rollout_temperature", hp.eval_temperature),
        ("generation_validation_rollout_top_p", hp.eval_top_p),
        ("num_prompts_per_step", hp.num_prompts_per_step),
        ("num_generations_per_prompt", hp.num_generations_per_prompt),
        ("target_accuracy", target_accuracy),
    ):
        log.event(key=key, value=value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint-dir", required=True)
    add_run_arguments(p)
    # Time each step takes after its checkpoint (a training that lasts: evaluation during it)
    p.add_argument("--step-seconds", type=float, default=0.0)
    # The seed the MLLOG states; NeMo-RL's launcher draws it at random (2115446333 in a
    # published log), apart from the run's seed index that names the log file.
    p.add_argument("--logged-seed", type=int, default=None)
    # NeMo-RL's checkpointing.keep_top_k (default null: every checkpoint kept)
    p.add_argument("--keep-top-k", type=int, default=None)
    # The target it logs: MLPERF_TARGET_ACCURACY in NeMo-RL's launcher (which defaults it to 1.0)
    p.add_argument("--target-accuracy", type=float, default=recipe.TARGET_ACCURACY)
    args = p.parse_args(argv)
    log_file = os.environ.get("MLPERF_MLLOG_FILE")
    if not log_file:
        print("MLPERF_MLLOG_FILE is not set", file=sys.stderr)
        return 2

    hp = recipe.hyperparameters(args.division, args.global_batch_size, args.max_steps)
    gbs, prompts = hp.global_batch_size, hp.num_prompts_per_step
    log = mllogger(log_file)
    logged_seed = args.seed if args.logged_seed is None else args.logged_seed
    header(log, hp, logged_seed, gbs * args.max_steps, args.target_accuracy)
    log.end(key="init_stop")
    time.sleep(0.002)
    log.start(key="run_start")
    last_update = 0
    for step in range(1, args.max_steps + 1):
        meta = {"samples_count": step * gbs, "step": step}
        log.start(key="block_start", metadata=meta)
        time.sleep(0.01)  # "policy.train()"
        last_update = now_ms()
        stats = {"reduced_train_loss": 1.0 / step, "reward": 0.1 * step, "grad_norm": 0.5,
                 "timing/train": 0.01}  # fmt: skip
        log.event(key="tracked_stats", value=stats, metadata=meta)
        if step >= args.val_start_at:
            content = {"skill": skill(step, args.skill_start, args.skill_per_step), "step": step}
            info = training_info(step, prompts, last_update)
            path = save_checkpoint(args.checkpoint_dir, step, info, content, args.keep_top_k)
            print(f"step {step}: saved {path}", flush=True)
        time.sleep(max(0.002, args.step_seconds))
    # Deferred mode: after teardown the driver backdates block_stop to the last weight update.
    log.end(
        key="block_stop",
        metadata={"samples_count": args.max_steps * gbs, "step": args.max_steps},
        time_ms=last_update,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
