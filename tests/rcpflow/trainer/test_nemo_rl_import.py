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


def imported_before_5(tmp_path: Path, ckpt: Path, run_dir: Path) -> None:
    """Steps 2..4 imported while 5 and 6 were not yet saved; 5 and 6 then in the tree."""
    aside = tmp_path / "aside"
    aside.mkdir()
    for step in (5, 6):
        shutil.move(ckpt / f"step_{step}", aside / f"step_{step}")
    assert import_checkpoint_tree(str(run_dir), str(ckpt), val_start_at=2).added == (2, 3, 4)
    for step in (5, 6):
        shutil.move(aside / f"step_{step}", ckpt / f"step_{step}")


def test_new_checkpoints_append_rows(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    manifest = Path(RunLayout(str(run_dir)).manifest)
    imported_before_5(tmp_path, ckpt, run_dir)
    first = manifest.read_bytes()
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


def test_a_poll_before_the_trainer_started_finds_nothing_yet(tmp_path, monkeypatch):
    """No MLLOG and no checkpoint yet: a wait's poll (`allow_empty`) is no error; a tree with a
    checkpoint but no MLLOG is, and so is any import that wants checkpoints."""
    run_dir, ckpt = tmp_path / "run", tmp_path / "run" / "ckpt"
    found = import_checkpoint_tree(str(run_dir), str(ckpt), seed=1, allow_empty=True)
    assert found.added == () and found.rows == 0
    with pytest.raises(NemoRLError, match="no MLLOG"):
        import_checkpoint_tree(str(run_dir), str(ckpt), seed=1)
    _, tree = train_nemo(tmp_path / "t", monkeypatch, max_steps=2)
    with pytest.raises(NemoRLError, match="no MLLOG"):  # checkpoints without their MLLOG
        import_checkpoint_tree(str(run_dir), str(tree), seed=1, allow_empty=True)


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


# The hostile tree: every refusal one line naming its step, never a traceback or a hang.


def test_a_fifo_or_dev_zero_as_training_info_is_refused_in_one_line(tmp_path, monkeypatch):
    import os

    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    info(ckpt, 3).unlink()
    os.mkfifo(info(ckpt, 3))  # a plain open() would block here with no writer
    refused(run_dir, ckpt, "step 3:", "training_info.json", "not a regular file")
    info(ckpt, 3).unlink()
    info(ckpt, 3).symlink_to("/dev/zero")  # read whole, it ends in MemoryError
    refused(run_dir, ckpt, "step 3:", "training_info.json", "symbolic link")


def test_a_huge_training_info_is_refused(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    data = json.loads(info(ckpt, 4).read_text())
    info(ckpt, 4).write_text(json.dumps({**data, "pad": "x" * 100_000}))
    refused(run_dir, ckpt, "step 4:", "more than 65536 bytes")


def test_step_folders_and_weights_outside_the_tree_are_named(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(ckpt / "step_3", elsewhere)
    (ckpt / "step_3").symlink_to(elsewhere)
    refused(run_dir, ckpt, "step 3:", "skipped: step_3 (a link to", "outside")
    (ckpt / "step_3").unlink()
    shutil.move(elsewhere, ckpt / "step_3")
    weights = ckpt / "step_5" / "policy" / "weights"
    shutil.move(weights, tmp_path / "weights")
    weights.symlink_to(tmp_path / "weights")
    refused(run_dir, ckpt, "step 5:", "policy/weights", "outside")


def test_only_ascii_step_names_without_leading_zeros_are_steps(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    shutil.copytree(ckpt / "step_3", ckpt / "step_03")
    shutil.copytree(ckpt / "step_3", ckpt / "step_\u0663")  # ARABIC-INDIC DIGIT THREE
    result = import_checkpoint_tree(str(run_dir), str(ckpt), val_start_at=2)
    assert result.added == (2, 3, 4, 5, 6)
    said = result.describe()
    assert "'step_03' (not a step name" in said and "'step_\\u0663' (not a step name" in said


# The seed: the run's seed index (seed_1.out) and the seed NeMo-RL logs kept apart.


def test_rows_name_the_mllog_read_whatever_seed_it_states(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch, logged_seed=2115446333)
    layout = RunLayout(str(run_dir))
    assert import_checkpoint_tree(str(run_dir), str(ckpt), val_start_at=2).added
    raw = [json.loads(ln) for ln in Path(layout.manifest).read_text().splitlines()]
    assert {(r["seed"], r["mllog_file"]) for r in raw} == {(1, "seed_1.out")}
    p = run_cli("manifest", "validate", layout.manifest)
    assert p.returncode == 0, p.stderr
    # manifest add reads the same log the same way
    other = tmp_path / "other"
    run_b, ckpt_b = train_nemo(other, monkeypatch, logged_seed=2115446333)
    step2 = str(ckpt_b / "step_2")
    t2 = json.loads(info(ckpt_b, 2).read_text())["training_step_end_time_ms"]
    p = run_cli("manifest", "add", str(run_b), "--step", "2", "--checkpoint", step2,
                "--timestamp-ms", str(t2), "--val-start-at", "2")  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert load(RunLayout(str(run_b)).manifest).row(2).mllog_file.endswith("/seed_1.out")


def test_validate_refuses_a_row_whose_mllog_is_not_there(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    layout = RunLayout(str(run_dir))
    import_checkpoint_tree(str(run_dir), str(ckpt), val_start_at=2)
    Path(layout.mllog(1)).rename(Path(layout.mllog_dir) / "elsewhere.log")
    p = run_cli("manifest", "validate", layout.manifest)
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("invalid: step 2: mllog_file ") and "seed_1.out does not exist" in last


def replace_in_log(run_dir: Path, old: str, new: str) -> None:
    log = Path(RunLayout(str(run_dir)).mllog(1))
    text = log.read_text()
    assert old in text
    log.write_text(text.replace(old, new))


def test_eval_samples_256_or_target_1_is_refused_at_import(tmp_path, monkeypatch):
    # what the reference's pinned logger and its launcher's default write
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    replace_in_log(run_dir, '"eval_samples", "value": 251', '"eval_samples", "value": 256')
    refused(run_dir, ckpt, "eval_samples 256", "not the benchmark's 251", "checker rejects")
    replace_in_log(run_dir, '"eval_samples", "value": 256', '"eval_samples", "value": 251')
    replace_in_log(run_dir, '"target_accuracy", "value": 0.69', '"target_accuracy", "value": 1.0')
    refused(run_dir, ckpt, "target_accuracy 1.0", "MLPERF_TARGET_ACCURACY=0.69")


def test_a_checkpoint_pruned_before_its_evaluation_is_named(tmp_path, monkeypatch):
    # NeMo-RL's deferred configuration keeps max(keep_top_k, 2) checkpoints: it deletes older ones
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    imported_before_5(tmp_path, ckpt, run_dir)
    shutil.rmtree(ckpt / "step_2")
    shutil.rmtree(ckpt / "step_3")
    layout = RunLayout(str(run_dir))
    before = Path(layout.manifest).read_bytes()
    with pytest.raises(NemoRLError) as e:
        import_checkpoint_tree(str(run_dir), str(ckpt))
    said = str(e.value)
    assert said.startswith("step 2: ") and "gone before its evaluation" in said
    assert "and 1 more: 3" in said and "checkpointing.keep_top_k" in said and "at least 5" in said
    assert Path(layout.manifest).read_bytes() == before  # nothing written
    Path(layout.summary(2)).parent.mkdir(parents=True)
    Path(layout.summary(2)).write_text("{}")  # step 2 evaluated before it went: no loss
    with pytest.raises(NemoRLError, match=r"^step 3: .*gone before its evaluation; deleted by"):
        import_checkpoint_tree(str(run_dir), str(ckpt))
    # a fresh import names the gap with the same setting
    Path(layout.manifest).unlink()
    with pytest.raises(NemoRLError, match=r"step 2: no .*contiguous.*checkpointing.keep_top_k"):
        import_checkpoint_tree(str(run_dir), str(ckpt), val_start_at=2)


def test_evaluation_after_training_refuses_a_keep_top_k_that_deletes_checkpoints(
    tmp_path, monkeypatch
):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch, keep_top_k=8)  # keeps all 5 from step 2
    config = ckpt / "step_2" / "config.yaml"
    assert "  keep_top_k: 8\n" in config.read_text()
    config.write_text(config.read_text().replace("keep_top_k: 8", "keep_top_k: 1"))
    argv = ["manifest", "import", str(run_dir), "--format", "nemo-rl", str(ckpt)]
    p = run_cli(*argv, "--val-start-at", "2", "--eval-schedule", "after_training")
    assert_one_invalid_line(
        p, "step 2:", "config.yaml", "keep_top_k 1 keeps 2", "needs all 5", "at least 5"
    )
    assert not Path(RunLayout(str(run_dir)).manifest).exists()
    p = run_cli(*argv, "--val-start-at", "2")  # during training it may keep pace: not refused
    assert p.returncode == 0, p.stderr
    config.write_text(config.read_text().replace("keep_top_k: 1", "keep_top_k: null"))
    p = run_cli(*argv, "--eval-schedule", "after_training")
    assert p.returncode == 0 and "nothing new" in p.stdout, p.stderr


def test_a_tree_keep_top_k_pruned_is_named_with_the_setting(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch, keep_top_k=3)  # as NeMo-RL prunes
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_4", "step_5", "step_6"]
    refused(run_dir, ckpt, "step 2: no ", "checkpointing.keep_top_k", "at least 5")
