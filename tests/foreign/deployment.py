"""Deployment files that run the foreign trainer and evaluator of this folder (for tests)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRAINER = HERE / "trainer.py"
EVALUATOR = HERE / "evaluator.py"
# The run this pair decides at step 5 (skill 0.7: pass@4 176/251 = 0.701 > 0.69); the toy's
# fast configuration otherwise.
FOREIGN_RUN: dict[str, Any] = {
    "seed": 1,
    "global_batch_size": 16,
    "max_steps": 6,
    "val_start_at": 2,
    "division": "open",
}
PASSING_STEP = 5


def run_flags(run: Mapping[str, object]) -> list[str]:
    """The run's parameters as the stand-in trainers' flags: ``--seed 1 --global-batch-size 16``
    and so on (trainer_args.add_run_arguments)."""
    return [arg for key, value in run.items() for arg in (f"--{key.replace('_', '-')}", str(value))]


# The run's flags in a job template: ``--seed {seed} --global-batch-size {global_batch_size}`` ...
RUN_TEMPLATE_FLAGS = run_flags({key: f"{{{key}}}" for key in FOREIGN_RUN})


def train_command(rows: str = "recorder") -> list[str]:
    return [
        "{python}", str(TRAINER),
        "--run-dir", "{run_dir}",
        "--ckpt-root", "{run_dir}/own_checkpoints",
        *RUN_TEMPLATE_FLAGS,
        "--rows", rows,
    ]  # fmt: skip


def evaluate_command(*extra: str) -> list[str]:
    return [
        "{python}", str(EVALUATOR),
        "--checkpoint", "{checkpoint_path}",
        "--step", "{step}",
        "--output-root", "{run_dir}/tunix_eval",
        *extra,
    ]  # fmt: skip


def write_foreign_deployment(
    path: Path,
    *,
    python: Path | str | None = None,
    rows: str = "recorder",
    evaluate_extra: tuple[str, ...] = (),
) -> Path:
    """A local deployment whose jobs are the foreign pair; the evaluator's Tunix tree is
    ``{run_dir}/tunix_eval``."""
    lines = [f"python = {json.dumps(str(python))}"] if python else []
    lines += [
        "allow_run_dirs_outside_root = true",  # run folders in the tests' temp dirs
        "[job_env]",
        'JAX_PLATFORMS = "cpu"',
        "[jobs.train]",
        f"command = {json.dumps(train_command(rows))}",
        "[jobs.evaluate]",
        f"command = {json.dumps(evaluate_command(*evaluate_extra))}",
        'result = { format = "tunix-tree", path = "{run_dir}/tunix_eval" }',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


NEMO_TRAINER = HERE / "nemo_trainer.py"
NEMO_EVALUATOR = HERE / "nemo_evaluator.py"
# The NeMo-RL-shaped pair decides FOREIGN_RUN at PASSING_STEP too (the same skill curve).
NEMO_EVAL_DIR = "{run_dir}/nemo_eval/step_{step}"


def nemo_train_command(*extra: str) -> list[str]:
    """NeMo-RL's trainer: its checkpoints under {checkpoint_dir}, its MLLOG where rcpflow's job
    template points MLPERF_MLLOG_FILE (the run folder's)."""
    return [
        "{python}", str(NEMO_TRAINER),
        "--checkpoint-dir", "{checkpoint_dir}",
        *RUN_TEMPLATE_FLAGS,
        *extra,
    ]  # fmt: skip


def nemo_evaluate_command() -> list[str]:
    """NeMo-RL's deferred evaluator on a view holding only checkpoint {step} (as its own driver
    builds one per checkpoint), its MLLOG a scratch file of that step."""
    script = (
        f"set -e; d={NEMO_EVAL_DIR}; rm -rf $d; mkdir -p $d/view; "
        "ln -s {checkpoint_path} $d/view/step_{step}; "
        f"MLPERF_MLLOG_FILE=$d/mllog.log exec {{python}} {NEMO_EVALUATOR} "
        "--checkpoint-root $d/view --log-dir $d"
    )
    return ["bash", "-c", script]


def nemo_jobs(*train_extra: str) -> list[str]:
    """The deployment's [jobs] tables of the NeMo-RL-shaped pair: the trainer's step_<N>/ tree
    and the evaluator's own MLLOG are their results."""
    return [
        "[jobs.train]",
        f"command = {json.dumps(nemo_train_command(*train_extra))}",
        'result = { format = "nemo-rl-checkpoints", path = "{checkpoint_dir}" }',
        "[jobs.evaluate]",
        f"command = {json.dumps(nemo_evaluate_command())}",
        f'result = {{ format = "nemo-rl-mllog", path = "{NEMO_EVAL_DIR}/mllog.log" }}',
    ]


def write_nemo_deployment(
    path: Path,
    *,
    python: Path | str | None = None,
    eval_schedule: str = "after_training",
    retention: str = "off",
    retention_while_training: bool = False,
) -> Path:
    """A local deployment whose jobs are the NeMo-RL-shaped pair; `retention`: its
    ``[retention] keep`` (and `retention_while_training` its ``while_training``)."""
    lines = [f"python = {json.dumps(str(python))}"] if python else []
    lines += [
        f"eval_schedule = {json.dumps(eval_schedule)}",
        "allow_run_dirs_outside_root = true",
        "checkpoint_poll_seconds = 0.5",
        *nemo_jobs(),
        "[retention]",
        f"keep = {json.dumps(retention)}",
        f"while_training = {json.dumps(retention_while_training)}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_nemo_slurm_deployment(
    path: Path,
    *,
    python: str,
    jobs_dir: Path,
    eval_schedule: str = "after_training",
    step_seconds: float = 0.0,
) -> Path:
    """The NeMo-RL-shaped pair on the Slurm backend (the local transport: sbatch on this
    machine, as against the private Slurm of `devtools.servers.slurm_cluster`), its job scripts
    and logs under `jobs_dir`, polled fast; each training step lasting `step_seconds`."""
    shape = ['time_limit = "10"', "signal_grace_s = 30", "max_restarts = 0"]
    lines = [
        'backend = "slurm"',
        f"eval_schedule = {json.dumps(eval_schedule)}",
        "allow_run_dirs_outside_root = true",
        "[slurm]",
        f"working_dir = {json.dumps(str(jobs_dir))}",
        f"log_dir = {json.dumps(str(jobs_dir / 'logs'))}",
        f"python = {json.dumps(python)}",
        "poll_interval_s = 0.5",
        "backoff_max_s = 1.0",
        "command_timeout_s = 10",
        "run_retries = 0",
        "[slurm.train]",
        *shape,
        "[slurm.evaluate]",
        *shape,
        *nemo_jobs("--step-seconds", str(step_seconds)),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path
