"""`rcpflow retention plan|apply` on a run folder: local disk and gs:// (the emulator)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gcs_batch import BatchProxy, batch_proxy
from rcpflow_cli import assert_one_invalid_line, cli_env_without_gcs_credentials, run_cli

from devtools.synthetic_run import SyntheticRun, make_run, write_eval
from rcpflow.files.storage import Storage, split_gcs, storage_for
from rcpflow.records.evaluating import held
from rcpflow.retention import apply as retention_apply
from rcpflow.retention import lock as retention_lock
from rcpflow.retention.apply import apply_run, plan_run, read_record
from rcpflow.retention.lock import RetentionBusy, holding


@pytest.fixture
def gcs_batches(gcs, monkeypatch) -> Iterator[BatchProxy]:
    """google-cloud-storage pointed at the emulator through a batch-answering proxy
    (tests/rcpflow/gcs_batch.py: fake-gcs-server answers no batch call)."""
    with batch_proxy(gcs.url) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        yield proxy


def _checkpoint(folder: Path, files: int = 3, full: bool = False) -> None:
    (folder / "params").mkdir(parents=True)
    for i in range(files):
        (folder / "params" / f"shard_{i}").write_bytes(b"w" * 10)
    if full:
        (folder / "train_state").mkdir()
        (folder / "train_state" / "opt").write_bytes(b"s" * 100)


def _run(tmp_path: Path) -> SyntheticRun:
    run = make_run(str(tmp_path / "run"), max_steps=22, accuracies={18: 0.5, 19: 0.5, 20: 0.8})
    for step in range(18, 23):
        _checkpoint(Path(run.layout.checkpoint(step)))
    return run


def _gcs_run(gcs_prefix: str, files: int) -> tuple[SyntheticRun, Storage]:
    """A run on gs:// decided at 20 (18, 19 below), each checkpoint `files` objects of 10 B."""
    run = make_run(gcs_prefix + "/run", max_steps=20, accuracies={18: 0.5, 19: 0.5, 20: 0.8})
    s = storage_for(gcs_prefix)
    for step in (18, 19, 20):
        for i in range(files):
            s.write_atomic(f"{run.layout.checkpoint(step)}/params/shard_{i}", b"w" * 10)
    return run, s


def _goes(run_dir: str) -> dict[int, str]:
    return {
        p.decision.step: p.decision.reason
        for p in plan_run(run_dir)
        if p.decision.goes and p.decision.part == "checkpoint"
    }


def test_plan_sizes_what_goes_and_keeps_the_unpersisted_and_passing(tmp_path: Path) -> None:
    run = _run(tmp_path)
    write_eval(run, 21, 0.9)
    planned = {p.decision.step: p for p in plan_run(run.run_dir)}
    assert sorted(_goes(run.run_dir)) == [18, 19, 21]
    assert (planned[18].files, planned[18].bytes) == (3, 30)
    assert not planned[20].decision.goes  # the passing one
    assert planned[22].decision.reason == "no persisted summary (maybe being evaluated)"
    p = run_cli("retention", "plan", run.run_dir)
    assert p.returncode == 0, p.stderr
    assert "step 22: kept (no persisted summary (maybe being evaluated))" in p.stdout
    assert "step 18: goes (evaluated below the target): 3 files, 30 B" in p.stdout
    assert p.stdout.splitlines()[-1] == "would delete 90 B"
    p = run_cli("retention", "plan", run.run_dir, "--settled")
    assert "step 22: goes (above the passing step 20, not evaluated" in p.stdout
    p = run_cli("retention", "plan", run.run_dir, "--keep", "nothing")
    assert (
        "step 20: goes (the passing checkpoint, not kept by the policy (keep nothing))" in p.stdout
    )
    # the plan deletes nothing
    assert all(Path(run.layout.checkpoint(s)).is_dir() for s in range(18, 23))


def test_apply_deletes_records_and_is_idempotent(tmp_path: Path) -> None:
    run = _run(tmp_path)
    p = run_cli("retention", "apply", run.run_dir)
    assert p.returncode == 0, p.stderr
    assert not Path(run.layout.checkpoint(18)).exists()
    assert not Path(run.layout.checkpoint(19)).exists()
    assert all(Path(run.layout.checkpoint(s)).is_dir() for s in (20, 21, 22))
    record = read_record(run.run_dir)
    assert record is not None and record["applies"][0]["done_ms"] is not None  # type: ignore[index]
    again = apply_run(run.run_dir)
    assert [p["step"] for p in again["parts"] if p["goes"]] == []  # type: ignore[attr-defined]
    assert len(read_record(run.run_dir)["applies"]) == 2  # type: ignore[index]


def test_a_symlink_out_of_the_tree_is_never_followed(tmp_path: Path) -> None:
    run = _run(tmp_path)
    outside = tmp_path / "precious"
    _checkpoint(outside)
    ckpt = Path(run.layout.checkpoint(18))
    for f in (ckpt / "params").iterdir():
        f.unlink()
    (ckpt / "params").rmdir()
    ckpt.rmdir()
    ckpt.symlink_to(outside)
    planned = {p.decision.step: p.decision for p in plan_run(run.run_dir)}
    assert planned[18].reason == "outside the run's checkpoint tree (never deleted)"
    apply_run(run.run_dir)
    assert len(list((outside / "params").iterdir())) == 3
    # a link inside the checkpoint is deleted as a link, its target untouched
    (Path(run.layout.checkpoint(21)) / "link").symlink_to(outside)
    write_eval(run, 21, 0.9)
    apply_run(run.run_dir)
    assert not Path(run.layout.checkpoint(21)).exists()
    assert len(list((outside / "params").iterdir())) == 3


def test_an_interrupted_apply_is_finished_by_the_rerun(tmp_path: Path, monkeypatch) -> None:
    run = _run(tmp_path)
    deleted: list[str] = []

    def crash(path: str) -> None:
        deleted.append(path)
        if len(deleted) == 4:  # mid-way through step 19
            raise KeyboardInterrupt

    monkeypatch.setattr(retention_apply, "after_delete", crash)
    with pytest.raises(KeyboardInterrupt):
        apply_run(run.run_dir)
    monkeypatch.setattr(retention_apply, "after_delete", None)
    record = read_record(run.run_dir)
    assert record["applies"][0]["done_ms"] is None  # type: ignore[index]  # the intent
    assert not Path(run.layout.checkpoint(18)).exists()
    assert Path(run.layout.checkpoint(19)).exists()
    done = apply_run(run.run_dir)
    assert len(read_record(run.run_dir)["applies"]) == 1  # type: ignore[index]  # finished it
    assert done["done_ms"] is not None and not Path(run.layout.checkpoint(19)).exists()
    assert {p["step"]: p["outcome"] for p in done["parts"] if p["goes"]} == {  # type: ignore[attr-defined]
        18: "deleted",
        19: "deleted",
    }


def test_a_file_written_after_the_intent_keeps_its_checkpoint(tmp_path: Path, monkeypatch) -> None:
    run = _run(tmp_path)

    def rewrite(path: str) -> None:
        if path.endswith("18/params/shard_0"):
            newer = Path(run.layout.checkpoint(19)) / "params" / "shard_0"
            newer.write_bytes(b"new")
            st = newer.stat()
            os.utime(newer, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))

    monkeypatch.setattr(retention_apply, "after_delete", rewrite)
    done = apply_run(run.run_dir)
    outcome = {p["step"]: p["outcome"] for p in done["parts"] if p["goes"]}  # type: ignore[attr-defined]
    assert outcome[18] == "deleted" and outcome[19].startswith("changed since the plan")
    assert (Path(run.layout.checkpoint(19)) / "params" / "shard_0").read_bytes() == b"new"


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=20)
    Path(run.layout.manifest).write_text(run.row(18).to_json() + "\n" + run.row(20).to_json())
    p = run_cli("retention", "plan", run.run_dir)
    assert p.returncode == 1 and len(p.stderr.splitlines()) == 1
    assert p.stderr.startswith(f"invalid: {run.run_dir}: no usable manifest:")
    p = run_cli("retention", "apply", str(tmp_path / "nowhere"))
    assert p.returncode == 1 and "Traceback" not in p.stderr and "nowhere" in p.stderr
    p = run_cli("retention", "plan", run.run_dir, "--keep", "all")
    assert p.returncode == 2 and "usage error" in p.stderr
    for flag, bad in (("--keep", " passing"), ("--last-k", " 1"), ("--last-k=-1", None)):
        p = run_cli("retention", "plan", run.run_dir, flag, *([] if bad is None else [bad]))
        line = p.stderr.splitlines()[-1]  # after argparse's usage lines
        assert p.returncode == 2 and line.startswith("usage error: argument --"), p.stderr
        assert flag.partition("=")[0] in line and "Traceback" not in p.stderr


@pytest.mark.gcs
def test_gcs_object_rewritten_between_plan_and_delete_is_kept(
    gcs_prefix: str, gcs_batches: BatchProxy, monkeypatch
) -> None:
    run, s = _gcs_run(gcs_prefix, files=3)
    planned = {p.decision.step: p for p in plan_run(run.run_dir)}
    assert planned[18].decision.goes and (planned[18].files, planned[18].bytes) == (3, 30)
    assert not planned[20].decision.goes
    victim = f"{run.layout.checkpoint(19)}/params/shard_2"

    def rewrite(path: str) -> None:
        if path.endswith("19/params/shard_0"):
            s.write_atomic(victim, b"rewritten")  # between the listing and its delete

    monkeypatch.setattr(retention_apply, "after_delete", rewrite)
    monkeypatch.setattr(retention_apply, "PAGE_SIZE", 1)  # paged listing, one object per call
    monkeypatch.setattr(retention_apply, "BATCH_SIZE", 1)  # a delete per batch: rewrite between
    done = apply_run(run.run_dir)
    outcome = {p["step"]: p["outcome"] for p in done["parts"] if p["goes"]}  # type: ignore[attr-defined]
    assert outcome[18] == "deleted"
    assert outcome[19].startswith("changed since the plan")
    assert s.read_bytes(victim) == b"rewritten"
    assert s.list(run.layout.checkpoint(18)) == []
    assert len(s.list(run.layout.checkpoint(20))) == 3
    assert json.loads(s.read_bytes(run.layout.retention))["applies"][0]["done_ms"] is not None
    assert split_gcs(victim)[0]


def test_before_block_stop_nothing_goes_and_after_it_the_full_states_go(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=20, accuracies={18: 0.5, 19: 0.8})
    for step in (18, 19, 20):
        _checkpoint(Path(run.layout.checkpoint(step)), full=True)
    log = run.log_file.read_text()
    run.log_file.write_text(
        "".join(line for line in log.splitlines(True) if "block_stop" not in line)
    )
    assert _goes(run.run_dir) == {}  # training runs: a resume needs every row's checkpoint
    run.log_file.write_text(log)
    planned = {(p.decision.step, p.decision.part): p for p in plan_run(run.run_dir)}
    assert planned[(18, "checkpoint")].decision.goes  # below the target, train_state with it
    assert (planned[(18, "checkpoint")].files, planned[(18, "checkpoint")].bytes) == (4, 130)
    state = planned[(19, "train_state")]
    assert state.decision.goes and state.decision.reason == "full state: training ended"
    assert not planned[(19, "checkpoint")].decision.goes
    apply_run(run.run_dir)
    passing = Path(run.layout.checkpoint(19))
    assert (passing / "params").is_dir() and not (passing / "train_state").exists()


@pytest.mark.gcs
def test_gcs_interrupted_apply_rerun_keeps_what_was_rewritten_since_its_plan(
    gcs_prefix: str, gcs_batches: BatchProxy, monkeypatch
) -> None:
    run, s = _gcs_run(gcs_prefix, files=2)

    def crash(path: str) -> None:
        raise KeyboardInterrupt  # killed after the first delete

    monkeypatch.setattr(retention_apply, "after_delete", crash)
    with pytest.raises(KeyboardInterrupt):
        apply_run(run.run_dir)
    monkeypatch.setattr(retention_apply, "after_delete", None)
    rewritten = f"{run.layout.checkpoint(19)}/params/shard_1"
    s.write_atomic(rewritten, b"new")  # after the intent was recorded
    done = apply_run(run.run_dir)
    outcome = {p["step"]: p["outcome"] for p in done["parts"] if p["goes"]}  # type: ignore[attr-defined]
    assert outcome[18] == "deleted" and s.list(run.layout.checkpoint(18)) == []
    assert outcome[19].startswith("changed since the plan") and s.read_bytes(rewritten) == b"new"
    assert len(s.list(run.layout.checkpoint(19))) == 2  # left whole, not half deleted
    assert len(json.loads(s.read_bytes(run.layout.retention))["applies"]) == 1


@pytest.mark.gcs
def test_gcs_deletes_go_in_batches_of_100_and_a_failed_object_is_named(
    gcs_prefix: str, gcs_batches: BatchProxy
) -> None:
    run = make_run(gcs_prefix + "/run", max_steps=20, accuracies={18: 0.5, 19: 0.5, 20: 0.8})
    s = storage_for(gcs_prefix)
    for i in range(230):  # step 18: 230 objects = batches of 100, 100, 30
        s.write_atomic(f"{run.layout.checkpoint(18)}/params/shard_{i:03}", b"w")
    for i in range(3):
        s.write_atomic(f"{run.layout.checkpoint(19)}/params/shard_{i}", b"w")
    gcs_batches.fail = ("19/params/shard_1",)  # one call of a batch fails (503), not the batch
    done = apply_run(run.run_dir)
    parts = {p["step"]: p for p in done["parts"] if p["goes"]}  # type: ignore[attr-defined]
    assert gcs_batches.batches == [100, 100, 30, 3]
    assert parts[18]["outcome"] == "deleted" and s.list(run.layout.checkpoint(18)) == []
    victim = f"{run.layout.checkpoint(19)}/params/shard_1"
    assert (
        parts[19]["outcome"] == f"not deleted: {victim}: HTTP 503 (see failed; a rerun tries again)"
    )
    assert parts[19]["failed"] == [f"{victim}: HTTP 503"] and parts[19]["failed_count"] == 1
    assert s.list(run.layout.checkpoint(19)) == [victim]  # the others of its batch went
    gcs_batches.fail = ()
    again = apply_run(run.run_dir)  # a rerun plans the part again and deletes what is left
    outcome = {p["step"]: p.get("outcome") for p in again["parts"] if p["goes"]}  # type: ignore[attr-defined]
    assert outcome == {19: "deleted"} and s.list(run.layout.checkpoint(19)) == []


def test_gcs_without_credentials_is_one_error_line(tmp_path: Path) -> None:
    env = cli_env_without_gcs_credentials(tmp_path)
    for action in ("plan", "apply"):
        assert_one_invalid_line(
            run_cli("retention", action, "gs://rcpflow-no-such-bucket/run", env=env),
            "gs://rcpflow-no-such-bucket/run",
            "no Google Cloud credentials",
            prefix="error: ",
        )


def test_a_second_apply_while_one_holds_the_run_folder_is_refused(
    tmp_path: Path, monkeypatch
) -> None:
    run = _run(tmp_path)
    second: list[subprocess.CompletedProcess[str]] = []

    def another_apply(path: str) -> None:
        if not second:  # the first apply holds the run folder, mid-way through its deletes
            second.append(run_cli("retention", "apply", run.run_dir))
            with pytest.raises(RetentionBusy, match="another retention apply holds"):
                apply_run(run.run_dir)  # in this process too: a lock per apply, not per process

    monkeypatch.setattr(retention_apply, "after_delete", another_apply)
    done = apply_run(run.run_dir)
    line = assert_one_invalid_line(
        second[0],
        run.layout.retention_lock,
        "another retention apply holds the run folder",
        f'"pid": {os.getpid()}',
        prefix="error: ",
    )
    assert "Traceback" not in line
    # the refused ones changed nothing: one apply recorded, it deleted what it planned
    assert len(read_record(run.run_dir)["applies"]) == 1  # type: ignore[index]
    assert {p["step"]: p["outcome"] for p in done["parts"] if p["goes"]} == {  # type: ignore[attr-defined]
        18: "deleted",
        19: "deleted",
    }
    monkeypatch.setattr(retention_apply, "after_delete", None)
    assert run_cli("retention", "apply", run.run_dir).returncode == 0  # released at its end


def test_a_patient_apply_waits_for_the_lock_and_gives_up_after_its_patience(
    tmp_path: Path, monkeypatch
) -> None:
    run = _run(tmp_path)
    other = holding(run.run_dir)  # another evaluate task's apply, mid-way
    other.__enter__()
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # the patient apply waits: the other one ends meanwhile
        waits.append(seconds)
        if len(waits) == 2:
            other.__exit__(None, None, None)

    monkeypatch.setattr(retention_lock.time, "sleep", sleep)
    done = apply_run(run.run_dir, patience_s=3600)
    assert len(waits) == 2 and done["done_ms"] is not None
    assert not Path(run.layout.checkpoint(18)).exists()
    monkeypatch.undo()
    with holding(run.run_dir), pytest.raises(RetentionBusy, match="another retention apply"):
        apply_run(run.run_dir, patience_s=0.3)  # held for longer than its patience
    assert len(read_record(run.run_dir)["applies"]) == 1  # type: ignore[index]


def test_an_apply_killed_mid_way_leaves_no_lock(tmp_path: Path, monkeypatch) -> None:
    run = _run(tmp_path)

    def crash(path: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(retention_apply, "after_delete", crash)
    with pytest.raises(KeyboardInterrupt):
        apply_run(run.run_dir)
    monkeypatch.setattr(retention_apply, "after_delete", None)
    p = run_cli("retention", "apply", run.run_dir)  # another process: the flock went with it
    assert p.returncode == 0, p.stderr


def test_a_lock_that_is_a_link_is_not_taken(tmp_path: Path) -> None:
    run = _run(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("")
    Path(run.layout.retention_lock).symlink_to(elsewhere)
    assert_one_invalid_line(
        run_cli("retention", "apply", run.run_dir),
        f"{run.layout.retention_lock}: cannot take the retention lock",
        prefix="error: ",
    )
    assert read_record(run.run_dir) is None and Path(run.layout.checkpoint(18)).is_dir()


@pytest.mark.gcs
def test_gcs_a_second_apply_is_refused_and_a_stale_lock_is_named(
    gcs_prefix: str, gcs_batches: BatchProxy, monkeypatch
) -> None:
    run, s = _gcs_run(gcs_prefix, files=1)
    refused: list[str] = []

    def another_apply(path: str) -> None:
        if not refused:
            with pytest.raises(RetentionBusy) as busy:
                apply_run(run.run_dir)
            refused.append(str(busy.value))

    monkeypatch.setattr(retention_apply, "after_delete", another_apply)
    apply_run(run.run_dir)
    assert refused and refused[0].startswith(f"{run.layout.retention_lock}: another retention")
    assert f'"pid": {os.getpid()}' in refused[0]
    assert not s.exists(run.layout.retention_lock)  # released at the end
    assert len(json.loads(s.read_bytes(run.layout.retention))["applies"]) == 1
    monkeypatch.setattr(retention_apply, "after_delete", None)
    s.write_atomic(run.layout.retention_lock, b'{"host": "gone", "pid": 1}')  # a killed apply's
    with pytest.raises(
        RetentionBusy, match=f"if no apply runs, delete {run.layout.retention_lock}"
    ):
        apply_run(run.run_dir)
    s.delete(run.layout.retention_lock)
    assert apply_run(run.run_dir)["done_ms"] is not None


def test_a_checkpoint_being_evaluated_is_kept_also_when_its_evaluation_starts_after_the_plan(
    tmp_path: Path, monkeypatch
) -> None:
    run = _run(tmp_path)  # 18, 19 below the target, 20 passes: 18 and 19 would go
    with held(run.run_dir, 18, run.layout.checkpoint(18), remove=True):
        planned = {p.decision.step: p.decision for p in plan_run(run.run_dir)}
        assert not planned[18].goes
        assert planned[18].reason.startswith(f"being evaluated ({run.layout.evaluating(18)}: pid")
        assert planned[19].goes
    started: list[object] = []

    def evaluation_starts(path: str) -> None:
        if not started:  # step 18 is being deleted; 19's evaluation starts meanwhile
            started.append(held(run.run_dir, 19, run.layout.checkpoint(19), remove=True))
            started[0].__enter__()  # type: ignore[attr-defined]

    monkeypatch.setattr(retention_apply, "after_delete", evaluation_starts)
    done = apply_run(run.run_dir)
    outcome = {p["step"]: p["outcome"] for p in done["parts"] if p["goes"]}  # type: ignore[attr-defined]
    assert outcome[18] == "deleted"
    assert outcome[19].startswith("being evaluated since the plan (")
    assert len(list((Path(run.layout.checkpoint(19)) / "params").iterdir())) == 3
    started[0].__exit__(None, None, None)  # type: ignore[attr-defined]
    monkeypatch.setattr(retention_apply, "after_delete", None)
    again = apply_run(run.run_dir)  # its evaluation over: the next apply deletes it
    assert {p["step"]: p["outcome"] for p in again["parts"] if p["goes"]} == {19: "deleted"}  # type: ignore[attr-defined]


def test_a_summary_of_another_checkpoint_decides_nothing_and_is_named(tmp_path: Path) -> None:
    run = _run(tmp_path)  # 18, 19 below the target: both would go
    summary_19 = Path(run.layout.summary(19)).read_text()
    Path(run.layout.summary(18)).write_text(summary_19)  # step 19's evaluation, filed as 18's
    moved = json.loads(summary_19)
    moved["checkpoint_timestamp_ms"] += 1  # the same step, another save of it
    Path(run.layout.summary(19)).write_text(json.dumps(moved))
    planned = {p.decision.step: p.decision for p in plan_run(run.run_dir)}
    assert not planned[18].goes and not planned[19].goes
    assert planned[18].reason.startswith("summary not valid: checkpoint_step: 19 != manifest's 18")
    assert "(a summary of another checkpoint)" in planned[18].reason
    assert planned[19].reason.startswith("summary not valid: checkpoint_timestamp_ms: ")
    apply_run(run.run_dir)
    assert Path(run.layout.checkpoint(18)).is_dir() and Path(run.layout.checkpoint(19)).is_dir()
