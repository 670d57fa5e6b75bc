"""The stop-request reader never raises into the trainer: a malformed file (deep nesting, a
folder, bytes that are not UTF-8, 64-bit overflow) is never a stop and is reported once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.trainer.recorder import TrainingRecorder
from rcpflow.verdict.stop_request import RunIdentity, for_run

IDENTITY = RunIdentity(seed=1, global_batch_size=256, val_start_at=18, max_steps=20, run_start_ms=1)


def _deep(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


def _folder(path: Path) -> None:
    path.mkdir()


def _latin1(path: Path) -> None:
    path.write_bytes(b'{"format": "\xff"}')


def _huge(path: Path) -> None:
    path.write_text('{"format": "rcpflow.verdict.stop_request.v1", "step": ' + "9" * 5000 + "}")


def _run_not_an_object(path: Path) -> None:
    path.write_text('{"format": "rcpflow.verdict.stop_request.v1", "run": [1], "step": 1}')


@pytest.mark.parametrize("make", [_deep, _folder, _latin1, _huge, _run_not_an_object])
def test_a_malformed_stop_request_is_never_a_stop_and_is_reported_once(tmp_path, caplog, make):
    make(Path(RunLayout(str(tmp_path)).stop_request))
    with caplog.at_level(logging.WARNING, logger="rcpflow.verdict.stop_request"):
        for _ in range(3):
            assert for_run(str(tmp_path), IDENTITY) is None
    warnings = [r for r in caplog.records if "ignoring the stop request" in r.getMessage()]
    assert len(warnings) == 1


def test_the_trainer_goes_on_past_a_malformed_stop_request(tmp_path):
    hp = recipe.hyperparameters("closed", 256, 20)
    rec = TrainingRecorder(str(tmp_path), seed=1, hyperparameters=hp, val_start_at=18)
    rec.on_init_start(1_700_000_000_000)
    rec.on_run_start(1_700_000_030_000)
    _deep(Path(RunLayout(str(tmp_path)).stop_request))
    assert rec.stop_requested() is False
