"""The run DAG's import of a train job's checkpoint tree (`tasks.run.train_result`) takes the
run's recorded evaluation schedule: after training, a NeMo-RL keep_top_k that would delete a
checkpoint before its evaluation is refused there as by hand; during training it is not."""

from __future__ import annotations

from pathlib import Path

import pytest
from nemo_runs import train_nemo

from rcpflow.files.layout import RunLayout
from rcpflow.records.checkpoint_state import ProgressError
from rcpflow.records.nemo_rl import NemoRLError
from rcpflow.verdict.schedule_record import ScheduleRecord, record_schedule
from tasks.jobs.templates import TrainResult
from tasks.run.train_result import import_checkpoints, import_for_wait


def pruning_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, TrainResult]:
    """A NeMo-RL-shaped run whose config says keep_top_k 1 (NeMo-RL keeps 2 of the 5)."""
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch, keep_top_k=8)  # all 5 still there
    for config in ckpt.glob("step_*/config.yaml"):
        config.write_text(config.read_text().replace("keep_top_k: 8", "keep_top_k: 1"))
    return run_dir, TrainResult(format="nemo-rl-checkpoints", path=str(ckpt))


def test_after_training_the_dag_refuses_a_keep_top_k_that_deletes_unevaluated_checkpoints(
    tmp_path, monkeypatch
):
    run_dir, result = pruning_run(tmp_path, monkeypatch)
    record_schedule(str(run_dir), ScheduleRecord(eval_schedule="after_training", eval_window=1))
    with pytest.raises(NemoRLError, match=r"step 2: .*keep_top_k 1 keeps 2.*needs all 5"):
        import_checkpoints(str(run_dir), 1, result, 2, allow_empty=False)
    with pytest.raises(ProgressError, match=r"checkpoint import: step 2: .*keep_top_k 1"):
        import_for_wait(str(run_dir), 1, result, 2)
    assert not Path(RunLayout(str(run_dir)).manifest).exists()


def test_during_training_or_unrecorded_the_same_tree_is_imported(tmp_path, monkeypatch):
    run_dir, result = pruning_run(tmp_path, monkeypatch)
    found = import_checkpoints(str(run_dir), 1, result, 2, allow_empty=False)  # no record
    assert found is not None and found.added == (2, 3, 4, 5, 6)
    record_schedule(str(run_dir), ScheduleRecord(eval_schedule="during_training", eval_window=2))
    again = import_checkpoints(str(run_dir), 1, result, 2, allow_empty=False)
    assert again is not None and again.added == ()


def test_a_schedule_record_it_cannot_read_is_named(tmp_path, monkeypatch):
    run_dir, result = pruning_run(tmp_path, monkeypatch)
    Path(RunLayout(str(run_dir)).eval_schedule).write_text("{}")
    with pytest.raises(NemoRLError, match=r"eval_schedule.json: format is not"):
        import_checkpoints(str(run_dir), 1, result, 2, allow_empty=False)
