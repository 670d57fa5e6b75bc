"""The MaxText evaluator (``python -m tpu_jobs.maxtext.evaluate --run-dir D --step N``), as the
seed evaluates: MaxText's own converter turns the step's native scanned checkpoint into an
unscanned bf16 parameter-only checkpoint (``generate_param_only_checkpoint``, under MaxText's
``unsafe_rbg`` PRNG), ``from_pretrained`` restores it with ``scan_layers=false``, and the
restored weights are checked against what training recorded before any attempt is scored.

The check: the manifest row's fingerprint must be the checkpoint's record (this is the
checkpoint the row names); the restored weights, put back in the scanned layout
(`tpu_jobs.maxtext.layout.restack`), must fingerprint to the record's
``weights_fingerprint_bf16``, which training took on the device from the scanned weights
rounded to bf16 as the converter rounds them: one value across the real layout change and the
rounding, or the evaluation is refused. Then pass@k and the summary are the shared evaluator's
(`tpu_jobs.eval.cli`: flags, exit codes; one worker, one process). The converted checkpoint
lives in a temporary folder, deleted once restored.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rcpflow import recipe
from tpu_jobs import task
from tpu_jobs.eval import cli
from tpu_jobs.eval.attempts import attempt_keys, attempt_rows, pad_rows, scored
from tpu_jobs.eval.shards import Record
from tpu_jobs.eval.target import CheckpointFacts, LoadedCheckpoint
from tpu_jobs.maxtext import layout, model
from tpu_jobs.maxtext.checkpoints import CheckpointRecord, read_record
from tpu_jobs.maxtext.config import ModelConfig
from tpu_jobs.rcp import collectives
from tpu_jobs.rcp.fingerprint import FingerprintMismatchError, weights_fingerprint
from tpu_jobs.rcp.job_cli import say

PROG = "python -m tpu_jobs.maxtext.evaluate"
BATCH_ROWS = 1024  # >= 251 x 4: one sampler call, one shape

Sampler = Callable[[np.ndarray, jax.Array, float, float], Any]


def check_row(path: str, record: CheckpointRecord, expected: str | None) -> None:
    """The manifest row's fingerprint (`expected`) names this checkpoint's recorded weights."""
    if expected is not None and expected != record.weights_fingerprint:
        raise FingerprintMismatchError(
            f"{path}: checkpoint records fingerprint {record.weights_fingerprint}, the manifest "
            f"expects {expected}: not the checkpoint the manifest recorded"
        )


def check_restored(path: str, record: CheckpointRecord, unscanned: Any) -> str:
    """The restored unscanned weights' fingerprint in the scanned layout, which must be the one
    training recorded of its scanned weights rounded to bf16; returned."""
    got = weights_fingerprint(layout.restack(unscanned))
    if got != record.weights_fingerprint_bf16:
        raise FingerprintMismatchError(
            f"{path}: the unscanned weights MaxText restored have fingerprint {got} in the "
            f"scanned layout, training recorded {record.weights_fingerprint_bf16} for its "
            "weights rounded to bf16: the conversion or the checkpoint is not what was "
            "trained; refusing to score"
        )
    return got


def run_attempts(sample: Sampler, instances: Sequence[int]) -> list[Record]:
    """4 attempts at each of `instances`, in one sampler call of `BATCH_ROWS` rows."""
    rows = attempt_rows(instances)
    if not rows:
        return []
    prompts = task.eval_prompts()[[i for i, _ in rows]]
    batch, keys = pad_rows(prompts, attempt_keys(rows), BATCH_ROWS)
    answers = sample(batch, keys, recipe.EVAL_TEMPERATURE, recipe.EVAL_TOP_P)
    return scored(rows, prompts, np.asarray(answers)[: len(rows)])


def load_unscanned(path: str, record: CheckpointRecord, work_dir: str) -> model.Restored:
    """Convert step folder `path` with MaxText's converter into `work_dir` and restore it
    unscanned; says how long each took."""
    size = ModelConfig.from_json(record.model, where=path)
    started = time.perf_counter()
    items = model.convert(size, path, str(Path(work_dir) / "unscanned"))
    converted = time.perf_counter()
    restored = model.restore(size, items, work_dir)
    collectives.wait_everywhere(restored.params())
    say(
        {
            "event": "unscanned",
            "step": record.step,
            "conversion_s": round(converted - started, 3),
            "restore_s": round(time.perf_counter() - converted, 3),
        }
    )
    return restored


class MaxTextCheckpoints:
    """The MaxText trainer's checkpoints (`tpu_jobs.maxtext.checkpoints`)."""

    batch_rows = BATCH_ROWS
    multi_process = False  # one process converts, restores and samples

    def load(self, path: str, expected_fingerprint: str | None) -> LoadedCheckpoint:
        record = read_record(path)
        check_row(path, record, expected_fingerprint)
        with tempfile.TemporaryDirectory(prefix="maxtext-unscanned-") as work_dir:
            restored = load_unscanned(path, record, work_dir)
        check_restored(path, record, restored.params())
        sample = model.answer_sampler(restored)
        samples = record.step * int(record.run["global_batch_size"])
        return LoadedCheckpoint(
            facts=CheckpointFacts(record.step, record.timestamp_ms, samples),
            attempts=lambda instances: run_attempts(sample, instances),
        )


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(
        argv,
        MaxTextCheckpoints(),
        prog=PROG,
        description="Evaluating a MaxText checkpoint (scanned -> unscanned): pass@4 on 251 "
        "instances.",
        checkpoint_help="standalone: one MaxText step folder (.../checkpoints/<step>)",
        sharded=False,
    )


if __name__ == "__main__":
    import sys

    sys.exit(main())
