"""Names that outlive a process are literals that never follow a module move: each format id a
file or record carries is pinned here, so a rename that would make a running trainer, an older
release or a stored file unreadable fails this table first (issue 33). To change one, write a
new id and keep reading the old one (as the stop request does)."""

from __future__ import annotations

import importlib

import pytest

from rcpflow.records import attempts
from rcpflow.trainer import ownership
from rcpflow.verdict import schedule_record, stop_request
from tpu_jobs.eval import shards
from tpu_jobs.rehearsal import checkpoints as rehearsal_checkpoints

PINNED = [
    (lambda: stop_request.FORMAT, "rcpflow.verdict.stop_request.v1"),
    (
        lambda: stop_request.READ_FORMATS,
        ("rcpflow.verdict.stop_request.v1", "rcpflow.stop_request.v1"),
    ),
    (lambda: ownership.FORMAT, "rcpflow.owner.v1"),
    (lambda: schedule_record.FORMAT, "rcpflow.eval_schedule.v1"),
    (lambda: attempts.DEEPSWE_SCHEMA, "canon.p46.deepswe-eval.trajectory.v4"),
    (lambda: rehearsal_checkpoints.FORMAT, "rcpflow-rehearsal-checkpoint/1"),
    (lambda: shards.HEADER_KIND, "rcpflow.eval_shard"),
    (lambda: shards.SHARD_FORMAT, 1),
]
# In modules that import JAX (the training jobs' images): imported only by this test.
PINNED_WITH_JAX = [
    ("tpu_jobs.rcp.checkpoint_format", "META_FORMAT", 1),
    ("tpu_jobs.rcp.native_checkpoints", "RECORD_FORMAT", 1),  # MaxText's and Tunix's
]


@pytest.mark.parametrize(("value", "pinned"), PINNED)
def test_a_format_id_keeps_its_value(value, pinned) -> None:
    assert value() == pinned


@pytest.mark.parametrize(("module", "name", "pinned"), PINNED_WITH_JAX)
def test_a_job_side_format_id_keeps_its_value(module: str, name: str, pinned: int) -> None:
    found = importlib.import_module(module)
    assert getattr(found, name) == pinned
