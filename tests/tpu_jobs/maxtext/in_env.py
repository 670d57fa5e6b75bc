"""What the MaxText tests run inside MaxText's environment (Python 3.13, MaxText 0.2.5), as
``<env python> tests/tpu_jobs/maxtext/in_env.py COMMAND ...``; each command prints one JSON
object on its last line. Never imported by the tests (they run Python 3.11 without MaxText).

- ``convert RUN_DIR STEP``: the step's scanned checkpoint read back with Orbax (its parameter
  shapes, the fingerprints of its float32 and bf16-rounded parameters), then MaxText's converter
  and ``from_pretrained(scan_layers=false)`` on it: each restored tensor against the scanned one
  sliced on the layer axis and rounded to bf16 (bit for bit), the fingerprints, the evaluator's
  check, and that check refusing a record whose bf16 fingerprint is another step's.
- ``train-stop RUN_DIR MAX_STEPS``: the trainer in process, a stop request for step 3 written
  while update 4 is recorded (as the orchestrator writes it once step 3 has passed).
- ``train-crash RUN_DIR MAX_STEPS``: the trainer in process, dying while update 4 is recorded
  (after step 3's row): what is left is what a preempted job leaves.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from typing import Any

import jax
import numpy as np

from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.records import manifest
from rcpflow.records.mllog import read_events, run_start_ms
from rcpflow.trainer.recorder import TrainingRecorder
from rcpflow.verdict import stop_request
from tpu_jobs.maxtext import evaluate, layout, model, train
from tpu_jobs.maxtext.checkpoints import read_record, read_scanned_params
from tpu_jobs.maxtext.config import PARAM_SCAN_AXIS, ModelConfig
from tpu_jobs.rcp.fingerprint import FingerprintMismatchError, weights_fingerprint

GBS = 32


def _bits(a: Any) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def scanned(run_dir: str, step: int) -> dict[str, Any]:
    folder = RunLayout(run_dir).checkpoint(step)
    params = read_scanned_params(folder)
    return {
        "shapes": model.tree_shapes(params),
        "fingerprint": weights_fingerprint(params),
        "fingerprint_bf16": weights_fingerprint(layout.as_bf16(params)),
        "record": dataclasses.asdict(read_record(folder)),
    }


def convert(run_dir: str, step: int) -> dict[str, Any]:
    folder = RunLayout(run_dir).checkpoint(step)
    record = read_record(folder)
    size = ModelConfig.from_json(record.model, where=folder)
    expected = layout.unstack(layout.as_bf16(read_scanned_params(folder)), axis=PARAM_SCAN_AXIS)
    with tempfile.TemporaryDirectory() as work:
        started = time.perf_counter()
        items = model.convert(size, folder, f"{work}/unscanned")
        converted = time.perf_counter()
        restored = model.restore(size, items, work).params()
        restore_s = time.perf_counter() - converted
    names = [name for name, _, _ in model.tree_shapes(expected)]
    equal = jax.tree.map(
        lambda a, b: a.dtype == b.dtype and a.shape == b.shape and (_bits(a) == _bits(b)).all(),
        jax.tree.map(np.asarray, expected),
        jax.tree.map(np.asarray, restored),
    )
    other = read_record(RunLayout(run_dir).checkpoint(step - 1))
    try:
        evaluate.check_restored(folder, dataclasses.replace(record, **{
            "weights_fingerprint_bf16": other.weights_fingerprint_bf16}), restored)  # fmt: skip
        refused = ""
    except FingerprintMismatchError as e:
        refused = str(e)
    return {
        "scanned": scanned(run_dir, step),
        "leaves": names,
        "restored_shapes": model.tree_shapes(restored),
        "all_equal": all(jax.tree.leaves(equal)),
        "unequal": [n for n, ok in zip(names, jax.tree.leaves(equal), strict=True) if not ok],
        "fingerprint_restored": evaluate.check_restored(folder, record, restored),
        "record": dataclasses.asdict(record),
        "conversion_s": converted - started,
        "restore_s": restore_s,
        "refused": refused,
    }


def _wait_for_row(run_dir: str, step: int) -> manifest.ManifestRow:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = {r.step: r for r in manifest.read_rows(RunLayout(run_dir).manifest)}
        if step in rows:
            return rows[step]
        time.sleep(0.01)
    raise AssertionError(f"step {step}: no row within 120 s")


def _at_update_4(act: Any) -> None:
    original = TrainingRecorder.on_update

    def on_update(self: TrainingRecorder, step: int, timestamp_ms: int | None = None) -> int:
        if step == 4:
            act()
        return original(self, step, timestamp_ms)

    TrainingRecorder.on_update = on_update  # type: ignore[method-assign]


def _train(run_dir: str, max_steps: int) -> dict[str, Any]:
    cfg = train.TrainConfig(
        run_dir=run_dir, seed=0, global_batch_size=GBS, max_steps=max_steps, val_start_at=2
    )
    return dataclasses.asdict(train.train(cfg))


def train_stop(run_dir: str, max_steps: int) -> dict[str, Any]:
    """Update 4 is being recorded when the request for step 3 (committed, with its row) is
    written; training must end after update 4."""

    def request() -> None:
        row = _wait_for_row(run_dir, 3)
        layout_ = RunLayout(run_dir)
        start = run_start_ms(read_events(layout_.mllog(0)))
        run = stop_request.RunIdentity(0, GBS, 2, max_steps, start)
        made = stop_request.StopRequest(run, 3, row.timestamp_ms, reason="test")
        storage_for(layout_.stop_request).write_atomic(layout_.stop_request, made.to_json())

    _at_update_4(request)
    return _train(run_dir, max_steps)


def train_crash(run_dir: str, max_steps: int) -> dict[str, Any]:
    def die() -> None:
        _wait_for_row(run_dir, 3)
        raise RuntimeError("simulated preemption while update 4 is recorded")

    _at_update_4(die)
    try:
        _train(run_dir, max_steps)
    except RuntimeError as e:
        return {"died": str(e)}
    raise AssertionError("training did not die")


def main(argv: list[str]) -> int:
    command, run_dir, number = argv[0], argv[1], int(argv[2])
    done = {"convert": convert, "train-stop": train_stop, "train-crash": train_crash}[command](
        run_dir, number
    )
    print(json.dumps(done, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
