"""Deployment files that run the foreign trainer and evaluator of this folder (for tests)."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAINER = HERE / "trainer.py"
EVALUATOR = HERE / "evaluator.py"
# The run this pair decides at step 5 (skill 0.7: pass@4 176/251 = 0.701 > 0.69); the toy's
# fast configuration otherwise.
FOREIGN_RUN = {
    "seed": 1,
    "global_batch_size": 16,
    "max_steps": 6,
    "val_start_at": 2,
    "division": "open",
}
PASSING_STEP = 5


def train_command(rows: str = "recorder") -> list[str]:
    return [
        "{python}", str(TRAINER),
        "--run-dir", "{run_dir}",
        "--ckpt-root", "{run_dir}/own_checkpoints",
        "--seed", "{seed}",
        "--global-batch-size", "{global_batch_size}",
        "--max-steps", "{max_steps}",
        "--val-start-at", "{val_start_at}",
        "--division", "{division}",
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
    python: str | None = None,
    rows: str = "recorder",
    evaluate_extra: tuple[str, ...] = (),
) -> Path:
    """A local deployment whose jobs are the foreign pair; the evaluator's Tunix tree is
    ``{run_dir}/tunix_eval``."""
    lines = [f"python = {json.dumps(python)}"] if python else []
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
