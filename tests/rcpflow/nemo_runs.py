"""A NeMo-RL-shaped run for rcpflow's tests: the stand-in trainer (tests/foreign/nemo_trainer.py)
run in this process on FOREIGN_RUN's numbers, its MLLOG the run folder's (where rcpflow's job
template points MLPERF_MLLOG_FILE), its step_<N>/ tree beside the run folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from foreign import nemo_trainer
from foreign.deployment import FOREIGN_RUN, run_flags

from rcpflow.files.layout import RunLayout


def train_nemo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **over: object
) -> tuple[Path, Path]:
    """The run folder and the trainer's checkpoint dir under `tmp_path`, once the trainer ran
    on FOREIGN_RUN with `over` replacing its values."""
    run_dir, ckpt = tmp_path / "run", tmp_path / "checkpoint" / "1"
    monkeypatch.setenv("MLPERF_MLLOG_FILE", RunLayout(str(run_dir)).mllog(1))
    argv = ["--checkpoint-dir", str(ckpt), *run_flags({**FOREIGN_RUN, **over})]
    assert nemo_trainer.main(argv) == 0
    return run_dir, ckpt
