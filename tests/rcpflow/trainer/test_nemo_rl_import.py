"""`rcpflow manifest import --format nemo-rl`: the manifest from NeMo-RL's step_<N>/ tree, written
by the NeMo-RL-shaped stand-in (tests/foreign/nemo_trainer.py); each malformed checkpoint named,
nothing written then; the same bytes again; new checkpoints appended; a gs:// tree."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from nemo_runs import train_nemo
from rcpflow_cli import assert_one_invalid_line, run_cli

from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.records.manifest import load
from rcpflow.records.nemo_rl import NemoRLError
from rcpflow.trainer.nemo_rl_import import import_checkpoint_tree


def info(ckpt: Path, step: int) -> Path:
    return ckpt / f"step_{step}" / "training_info.json"


def edit(ckpt: Path, step: int, **fields: object) -> None:
    path = info(ckpt, step)
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def refused(run_dir: Path, ckpt: Path, *expected: str) -> None:
    with pytest.raises(NemoRLError) as e:
        import_checkpoint_tree(str(run_dir), str(ckpt), val_start_at=2)
    for text in expected:
        assert text in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    assert not Path(RunLayout(str(run_dir)).manifest).exists()  # nothing written


def test_the_tree_becomes_the_manifest_and_again_gives_the_same_bytes(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    (ckpt / "tmp_step_7").mkdir()  # a save not yet renamed: never a checkpoint
    result = import_checkpoint_tree(str(run_dir), str(ckpt), val_start_at=2)
    assert result.added == (2, 3, 4, 5, 6) and "tmp_step_7" in result.ignored
    layout = RunLayout(str(run_dir))
    rows = load(layout.manifest).rows
    assert [r.step for r in rows] == [2, 3, 4, 5, 6]
    for r in rows:
        stored = json.loads(info(ckpt, r.step).read_text())
        assert r.timestamp_ms == stored["training_step_end_time_ms"]
        assert r.samples_count == r.step * 16 and r.checkpoint_path == str(ckpt / f"step_{r.step}")
    before = Path(layout.manifest).read_bytes()
    assert import_checkpoint_tree(str(run_dir), str(ckpt)).added == ()
    assert Path(layout.manifest).read_bytes() == before


def test_new_checkpoints_append_rows(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    aside = tmp_path / "aside"
    aside.mkdir()
    for step in (5, 6):
        shutil.move(ckpt / f"step_{step}", aside / f"step_{step}")
    assert import_checkpoint_tree(str(run_dir), str(ckpt), val_start_at=2).added == (2, 3, 4)
    manifest = Path(RunLayout(str(run_dir)).manifest)
    first = manifest.read_bytes()
    for step in (5, 6):
        shutil.move(aside / f"step_{step}", ckpt / f"step_{step}")
    assert import_checkpoint_tree(str(run_dir), str(ckpt)).added == (5, 6)
    assert manifest.read_bytes().startswith(first)


def test_the_cli_imports_and_refuses_in_one_line(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    edit(ckpt, 4, current_step=5)
    # a relative root is the caller's (its working folder), recorded so that it resolves
    argv = ["manifest", "import", "run", "--format", "nemo-rl", "checkpoint/1"]
    monkeypatch.chdir(tmp_path)
    p = run_cli(*argv, "--val-start-at", "2")
    assert_one_invalid_line(p, "step 4", "training_info.json", "current_step 5")
    edit(ckpt, 4, current_step=4)
    p = run_cli(*argv, "--val-start-at", "2")
    assert p.returncode == 0, p.stderr
    assert "steps 2..6 added" in p.stdout
    assert load(RunLayout(str(run_dir)).manifest).row(2).checkpoint_path == str(ckpt / "step_2")


def test_a_wrong_step_is_named(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    edit(ckpt, 3, current_step=4)
    refused(run_dir, ckpt, "step 3:", "step_3/training_info.json", "current_step 4")


def test_consumed_samples_in_rollouts_is_named(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    edit(ckpt, 5, consumed_samples=5 * 16)
    refused(run_dir, ckpt, "step 5:", "consumed_samples 80", "num_prompts_per_step 1", "prompts")


def test_timestamps_out_of_order_are_named(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    t3 = json.loads(info(ckpt, 3).read_text())["training_step_end_time_ms"]
    edit(ckpt, 4, training_step_end_time_ms=t3 - 1)
    refused(run_dir, ckpt, "step 4:", "training_step_end_time_ms", "not after step 3")


def test_a_timestamp_after_block_stop_or_before_run_start_is_named(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    t6 = json.loads(info(ckpt, 6).read_text())["training_step_end_time_ms"]
    edit(ckpt, 6, training_step_end_time_ms=t6 + 1)
    refused(run_dir, ckpt, "step 6:", "after the training's block_stop")
    edit(ckpt, 6, training_step_end_time_ms=t6)
    edit(ckpt, 2, training_step_end_time_ms=1_700_000_000_000)
    refused(run_dir, ckpt, "step 2:", "before the MLLOG's run_start")


def test_a_missing_step_is_named(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    shutil.rmtree(ckpt / "step_3")
    refused(run_dir, ckpt, "step 3:", "no ", "step_3/", "contiguous")


def test_a_tmp_step_only_is_named(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch, max_steps=2)
    (ckpt / "step_2").rename(ckpt / "tmp_step_2")
    refused(run_dir, ckpt, "no step_<N>/ checkpoint", "only tmp_step_2")
    assert (
        import_checkpoint_tree(str(run_dir), str(ckpt), val_start_at=2, allow_empty=True).added
        == ()
    )


def test_no_weights_and_missing_keys_are_named(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    shutil.rmtree(ckpt / "step_4" / "policy" / "weights")
    refused(run_dir, ckpt, "step 4:", "policy/weights")
    run_dir, ckpt = train_nemo(tmp_path / "b", monkeypatch)
    data = json.loads(info(ckpt, 2).read_text())
    del data["training_step_end_time_ms"]
    info(ckpt, 2).write_text(json.dumps(data))
    refused(run_dir, ckpt, "step 2:", "no field training_step_end_time_ms")
    edit(ckpt, 2, training_step_end_time_ms=True)
    refused(run_dir, ckpt, "step 2:", "is not an integer")


def test_a_training_section_the_checker_rejects_is_refused(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    log = Path(RunLayout(str(run_dir)).mllog(1))
    log.write_text(
        "".join(ln for ln in log.read_text().splitlines(True) if "eval_samples" not in ln)
    )
    refused(run_dir, ckpt, "seed_1.out", "no eval_samples")


@pytest.mark.gcs
@pytest.mark.timeout(300)
def test_a_gs_tree_into_a_gs_run(tmp_path, monkeypatch, gcs_prefix):
    local_run, ckpt = train_nemo(tmp_path, monkeypatch)
    run_dir, root = f"{gcs_prefix}/run", f"{gcs_prefix}/checkpoint/1"
    for path in sorted(p for p in ckpt.rglob("*") if p.is_file()):
        dest = f"{root}/{path.relative_to(ckpt).as_posix()}"
        storage_for(dest).write_atomic(dest, path.read_bytes())
    log = RunLayout(run_dir).mllog(1)
    storage_for(log).write_atomic(log, Path(RunLayout(str(local_run)).mllog(1)).read_bytes())
    storage_for(root).write_atomic(f"{root}/tmp_step_7/training_info.json", b"{}")
    result = import_checkpoint_tree(run_dir, root, val_start_at=2)
    assert result.added == (2, 3, 4, 5, 6)
    rows = load(RunLayout(run_dir).manifest).rows
    assert rows[0].checkpoint_path == f"{root}/step_2"
    assert import_checkpoint_tree(run_dir, root).added == ()


def test_concurrent_imports_of_one_tree_agree(tmp_path, monkeypatch):
    # the run DAG imports from the train task and from every wait: the same rows are no conflict
    import concurrent.futures

    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(
                lambda _: import_checkpoint_tree(str(run_dir), str(ckpt), val_start_at=2), range(4)
            )
        )
    assert sum(len(r.added) for r in results) >= 5
    assert [r.step for r in load(RunLayout(str(run_dir)).manifest).rows] == [2, 3, 4, 5, 6]
