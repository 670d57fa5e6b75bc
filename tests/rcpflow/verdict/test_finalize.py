"""Finalize: every branch, idempotence, re-finalize, and the official checker on what it writes."""

import json
from pathlib import Path

import pytest
from rcpflow_cli import run_cli

from devtools.synthetic_run import make_run, write_eval
from rcpflow.records.mllog import read_events
from rcpflow.verdict.finalize import FinalizeInputError, finalize


def _events(run, key):
    return [e for e in read_events(run.layout.mllog(run.seed)) if e.key == key]


def _text(run):
    return Path(run.layout.mllog(run.seed)).read_text()


def test_success_backdated_to_first_passing_step(tmp_path):
    run = make_run(str(tmp_path), accuracies={18: 0.5, 19: 0.6, 20: 0.75, 21: 0.9})
    training = _text(run)
    result = finalize(run.run_dir)
    assert (result.status, result.step, result.samples_count) == ("success", 20, 20 * 256)
    assert result.time_ms == run.row(20).timestamp_ms
    assert result.evaluated_steps == (18, 19, 20)
    (stop,) = _events(run, "run_stop")
    assert stop.metadata["status"] == "success"
    assert stop.time_ms == run.row(20).timestamp_ms
    acc = _events(run, "eval_accuracy")
    assert [e.metadata["samples_count"] for e in acc] == [18 * 256, 19 * 256, 20 * 256]
    assert [e.metadata["step"] for e in acc] == [18, 19, 20]
    assert _text(run).startswith(training)  # training section kept byte for byte
    stats = _events(run, "tracked_stats")
    assert stats[0].value == {"validation_time": 4.321}


def test_pass_is_strictly_above_target(tmp_path):
    # No k/251 equals 0.69; the two neighbours straddle it.
    run = make_run(str(tmp_path), max_steps=19, accuracies={18: 173 / 251, 19: 174 / 251})
    result = finalize(run.run_dir)
    assert result.status == "success" and result.step == 19
    assert 173 / 251 < 0.69 < 174 / 251


def test_second_finalize_is_byte_identical(tmp_path):
    run = make_run(str(tmp_path), accuracies={18: 0.2, 19: 0.8})
    finalize(run.run_dir)
    first = _text(run)
    finalize(run.run_dir)
    assert _text(run) == first


def test_refinalize_after_new_results(tmp_path):
    run = make_run(str(tmp_path), accuracies={18: 0.2, 19: 0.3})
    training = _text(run)
    assert finalize(run.run_dir).status == "incomplete"
    assert _events(run, "run_stop") == []
    assert len(_events(run, "eval_accuracy")) == 2
    write_eval(run, 20, 0.8)
    result = finalize(run.run_dir)
    assert (result.status, result.step) == ("success", 20)
    assert len(_events(run, "eval_accuracy")) == 3  # the old eval section was replaced
    assert len(_events(run, "run_stop")) == 1
    # and re-evaluating 19 to a pass moves the verdict earlier, dropping step 20's events
    write_eval(run, 19, 0.9)
    assert finalize(run.run_dir).step == 19
    assert [e.metadata["step"] for e in _events(run, "eval_accuracy")] == [18, 19]
    assert _text(run).startswith(training)


def test_aborted_when_max_steps_reached_without_pass(tmp_path):
    run = make_run(str(tmp_path), max_steps=21, accuracies={s: 0.4 for s in range(18, 22)})
    result = finalize(run.run_dir)
    assert (result.status, result.step) == ("aborted", 21)
    assert result.time_ms == run.row(21).timestamp_ms
    (stop,) = _events(run, "run_stop")
    assert stop.metadata == {**stop.metadata, "status": "aborted", "samples_count": 21 * 256}


def test_incomplete_when_training_stopped_early(tmp_path):
    run = make_run(
        str(tmp_path), max_steps=30, last_step=21, accuracies={s: 0.4 for s in range(18, 22)}
    )
    result = finalize(run.run_dir)
    assert result.status == "incomplete" and "stopped before max_steps" in result.reason
    assert _events(run, "run_stop") == []


def test_gap_in_summaries_is_incomplete(tmp_path):
    run = make_run(str(tmp_path), accuracies={18: 0.2, 20: 0.9})
    result = finalize(run.run_dir)
    assert result.status == "incomplete" and "step 19: no eval summary" in result.reason
    assert [e.metadata["step"] for e in _events(run, "eval_accuracy")] == [18]
    assert _events(run, "run_stop") == []


def test_failed_evaluation_never_produces_run_stop(tmp_path):
    run = make_run(str(tmp_path), accuracies={18: 0.2})
    write_eval(run, 19, 0.95, fatal_error="restore failed: fingerprint mismatch")
    write_eval(run, 20, 0.95)
    result = finalize(run.run_dir)
    assert result.status == "incomplete" and "fatal error" in result.reason
    assert _events(run, "run_stop") == []


def test_invalid_summary_leaves_log_untouched(tmp_path):
    run = make_run(str(tmp_path), accuracies={18: 0.2, 19: 0.9})
    finalize(run.run_dir)
    before = _text(run)
    Path(run.layout.summary(18)).write_text('{"instances": 251')
    with pytest.raises(FinalizeInputError, match="step 18"):
        finalize(run.run_dir)
    assert _text(run) == before


def test_invalid_manifest_leaves_log_untouched(tmp_path):
    run = make_run(str(tmp_path), accuracies={18: 0.9})
    finalize(run.run_dir)
    before = _text(run)
    with open(run.layout.manifest, "a") as f:
        f.write("garbage\n")
    with pytest.raises(FinalizeInputError, match="line 8: not JSON"):
        finalize(run.run_dir)
    assert _text(run) == before


def test_stale_rows_are_ignored(tmp_path):
    run = make_run(
        str(tmp_path),
        max_steps=22,
        last_step=20,
        stale_steps=(21, 22),
        accuracies={18: 0.1, 19: 0.1, 20: 0.1},
    )
    result = finalize(run.run_dir)
    assert result.status == "incomplete"  # 20 < max_steps 22: not aborted
    assert any("step 21" in w for w in result.warnings)


def test_log_must_match_manifest(tmp_path):
    run = make_run(str(tmp_path), accuracies={18: 0.9})
    text = _text(run).replace('"key": "seed", "value": 1', '"key": "seed", "value": 2')
    Path(run.layout.mllog(1)).write_text(text)
    with pytest.raises(FinalizeInputError, match="seed 2"):
        finalize(run.run_dir)


@pytest.mark.parametrize("division", ["closed", "open"])
def test_official_checker_accepts_finalized_log(tmp_path, division):
    from rcpflow.submission.checkers import compliance

    run = make_run(str(tmp_path / "run"), division=division, accuracies={18: 0.6, 19: 0.72})
    assert finalize(run.run_dir).status == "success"
    verdict = compliance(run.layout.mllog(1), division=division, log_dir=str(tmp_path))
    assert verdict.ok, verdict.output


def test_official_checker_rejects_non_passing_log(tmp_path):
    from rcpflow.submission.checkers import compliance

    run = make_run(str(tmp_path / "run"), max_steps=19, accuracies={18: 0.6, 19: 173 / 251})
    assert finalize(run.run_dir).status == "aborted"
    assert not compliance(run.layout.mllog(1), division="closed", log_dir=str(tmp_path)).ok


@pytest.mark.gcs
def test_finalize_on_gcs(gcs_prefix):
    run = make_run(gcs_prefix, accuracies={18: 0.5, 19: 0.8})
    result = finalize(run.run_dir)
    assert (result.status, result.step) == ("success", 19)
    assert result.log_path == f"{gcs_prefix}/mllog/seed_1.out"
    assert len(_events(run, "run_stop")) == 1


def test_cli_finalize_exit_codes(tmp_path):
    ok = make_run(str(tmp_path / "ok"), accuracies={18: 0.9})
    p = run_cli("finalize", ok.run_dir)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {
        "status": "success",
        "step": 18,
        "samples_count": 18 * 256,
        "time_ms": ok.row(18).timestamp_ms,
    }
    inc = make_run(str(tmp_path / "inc"), accuracies={18: 0.1})
    p = run_cli("finalize", inc.run_dir)
    assert p.returncode == 3
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"status": "incomplete"}
    p = run_cli("finalize", str(tmp_path / "missing"))
    assert p.returncode == 1 and "missing: does not exist; did you mean " in p.stderr


def test_cli_manifest_validate_and_val_start(tmp_path):
    run = make_run(str(tmp_path), max_steps=20)
    p = run_cli("manifest", "validate", run.layout.manifest, "--mllog", run.layout.mllog(1))
    assert p.returncode == 0 and "3 rows" in p.stdout
    Path(run.layout.manifest).write_text(run.row(18).to_json() + "\n" + run.row(20).to_json())
    p = run_cli("manifest", "validate", run.layout.manifest)
    assert p.returncode == 1 and "steps 19 missing between 18 and 20" in p.stderr
    p = run_cli("val-start", "--global-batch-size", "512")
    assert p.returncode == 0 and p.stdout.strip().splitlines()[-1] == "10"
    p = run_cli("val-start", "--global-batch-size", "100")
    assert p.returncode == 0 and p.stdout.strip().splitlines()[-1] == "41"
    assert "not a multiple of 16" in p.stderr
    assert run_cli("val-start", "--global-batch-size", "0").returncode == 1
    assert (
        run_cli("val-start", "--global-batch-size", "256", "--override", "3").stdout.strip() == "3"
    )


def test_cli_check(tmp_path):
    run = make_run(str(tmp_path / "run"), accuracies={18: 0.9})
    finalize(run.run_dir)
    log = run.layout.mllog(1)
    p = run_cli("check", log, "--division", "closed", "--log-dir", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    p = run_cli("check", log, "--log-dir", str(tmp_path))  # the log declares closed
    assert p.returncode == 0 and "(closed," in p.stdout
    p = run_cli("check", log, "--division", "open", "--log-dir", str(tmp_path))
    assert p.returncode == 1 and "submission_division" in p.stderr
    p = run_cli("check", str(tmp_path / "missing.out"))
    assert p.returncode == 1 and "missing.out: does not exist; give an MLLOG" in p.stderr


def test_cli_check_open_log_by_default(tmp_path):
    run = make_run(str(tmp_path / "run"), division="open", accuracies={18: 0.9})
    finalize(run.run_dir)
    p = run_cli("check", run.layout.mllog(1), "--log-dir", str(tmp_path))
    assert p.returncode == 0 and "(open," in p.stdout, p.stdout + p.stderr
