"""A NeMo-RL-shaped run for rcpflow's tests: the stand-in trainer (tests/foreign/nemo_trainer.py)
run in this process on FOREIGN_RUN's numbers, its MLLOG the run folder's (where rcpflow's job
template points MLPERF_MLLOG_FILE), its step_<N>/ tree beside the run folder; and the stand-in
evaluator (tests/foreign/nemo_evaluator.py) on a view of one step, as NeMo-RL's driver runs it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from foreign import nemo_evaluator, nemo_trainer
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


def view_of(ckpt: Path, view: Path, *steps: int) -> Path:
    """`view` holding links to `ckpt`'s step_<N>/ of `steps` only (as NeMo-RL's driver builds
    one for its evaluator)."""
    view.mkdir(parents=True, exist_ok=True)
    for step in steps:
        if not (view / f"step_{step}").exists():
            os.symlink(ckpt / f"step_{step}", view / f"step_{step}")
    return view


def evaluate_nemo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ckpt: Path, step: int, *extra: str
) -> Path:
    """NeMo-RL's evaluator on a view holding only step_<step>, its MLLOG a scratch file."""
    work = tmp_path / "nemo_eval" / f"step_{step}"
    view = view_of(ckpt, work / "view", step)
    log = work / "mllog.log"
    monkeypatch.setenv("MLPERF_MLLOG_FILE", str(log))
    argv = ["--checkpoint-root", str(view), "--log-dir", str(work), *extra]
    assert nemo_evaluator.main(argv) == 0
    return log
