"""NeMo-RL's deferred evaluator's accuracy, imported (`eval import --format nemo-rl-mllog`), and
finalize on a NeMo-RL run: the checker's strict > (a checkpoint at exactly 0.69 never ends the
run, though NeMo-RL's own >= says it does), the trainer's training section kept byte for byte
(its per-step tracked_stats), a log already ended by NeMo-RL's driver refused, and every
official checker verdict on the result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from foreign import nemo_evaluator
from nemo_runs import evaluate_nemo, train_nemo, view_of
from rcpflow_cli import assert_one_invalid_line, run_cli

from rcpflow.cli.status import NOT_RECOMPUTED, render_table, run_status
from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from rcpflow.records.mllog import read_events
from rcpflow.records.summary import read_summary
from rcpflow.submission.checkers import compliance
from rcpflow.trainer.nemo_rl_import import import_checkpoint_tree
from rcpflow.verdict.eval_import import EvalImportError, import_eval
from rcpflow.verdict.finalize import FinalizeInputError, finalize


def trained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **over: object) -> tuple[str, Path]:
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch, **over)
    import_checkpoint_tree(str(run_dir), str(ckpt), val_start_at=2)
    return str(run_dir), ckpt


def test_the_logged_accuracy_is_imported_with_its_eval_times(tmp_path, monkeypatch):
    run_dir, ckpt = trained(tmp_path, monkeypatch)
    log = evaluate_nemo(tmp_path, monkeypatch, ckpt, 3)
    events = read_events(str(log))
    assert [e.key for e in events] == ["eval_start", "eval_accuracy", "eval_stop", "run_stop"]
    imported = import_eval(run_dir, 3, str(log), fmt="nemo-rl-mllog")
    summary = read_summary(RunLayout(run_dir).summary(3))
    assert summary.attempt_records is False
    assert summary.eval_accuracy == events[1].value
    assert (summary.eval_start_ms, summary.eval_stop_ms) == (events[0].time_ms, events[2].time_ms)
    assert "no per-attempt records" in imported.describe()
    assert "could not be recomputed" in imported.describe()
    assert json.loads(Path(imported.summary_path).read_text())["attempt_records"] is False
    status = run_status(run_dir)
    assert [s.attempt_records for s in status.steps][:2] == [True, False]
    assert f"step 3: {NOT_RECOMPUTED}" in render_table(status)
    from plugins.rcp_view.pages import _step_row  # the RCP view's checkpoint table row

    row = _step_row(run_dir, status.steps[1])
    assert "not recomputed: no per-attempt records" in row
    assert "not recomputed" not in _step_row(run_dir, status.steps[0])


def test_another_samples_count_none_or_outside_0_1_is_refused_named(tmp_path, monkeypatch):
    run_dir, ckpt = trained(tmp_path, monkeypatch)
    log3 = evaluate_nemo(tmp_path, monkeypatch, ckpt, 3)
    with pytest.raises(EvalImportError, match=r"step 2: no eval_accuracy with samples_count 32 "
                       r"\(only samples_count 48\)"):  # fmt: skip
        import_eval(run_dir, 2, str(log3), fmt="nemo-rl-mllog")
    empty = tmp_path / "empty.log"
    empty.write_text("")
    with pytest.raises(EvalImportError, match="none at all"):
        import_eval(run_dir, 2, str(empty), fmt="nemo-rl-mllog")
    log4 = evaluate_nemo(tmp_path, monkeypatch, ckpt, 4, "--accuracy", "1.5")
    with pytest.raises(EvalImportError, match=r"eval_accuracy \(line 2\) value 1.5 is not"):
        import_eval(run_dir, 4, str(log4), fmt="nemo-rl-mllog")
    assert not Path(RunLayout(run_dir).summary(2)).exists()
    assert not Path(RunLayout(run_dir).summary(4)).exists()
    p = run_cli("eval", "import", run_dir, "--step", "2", str(log3), "--format", "nemo-rl-mllog")
    assert_one_invalid_line(p, "step 2", "samples_count 32", str(log3))


def _decided(tmp_path, monkeypatch, accuracies: dict[int, str]) -> tuple[str, Path]:
    run_dir, ckpt = trained(tmp_path, monkeypatch)
    for step, acc in accuracies.items():
        log = evaluate_nemo(tmp_path, monkeypatch, ckpt, step, "--accuracy", acc)
        p = run_cli("eval", "import", run_dir, "--step", str(step), str(log),
                    "--format", "nemo-rl-mllog")  # fmt: skip
        assert p.returncode == 0, p.stderr
    return run_dir, ckpt


def test_exactly_069_never_ends_the_run(tmp_path, monkeypatch):
    # NeMo-RL's evaluator says success at 0.69 (>=); the checker's rule is > 0.69.
    run_dir, _ = _decided(tmp_path, monkeypatch, {2: "0.5", 3: "0.69", 4: "0.70"})
    own = read_events(str(tmp_path / "nemo_eval" / "step_3" / "mllog.log"))
    assert [e.metadata["status"] for e in own if e.key == "run_stop"] == ["success"]
    log = Path(RunLayout(run_dir).mllog(1))
    training = log.read_bytes()
    result = finalize(run_dir)
    assert (result.status, result.step) == ("success", 4)
    assert log.read_bytes().startswith(training)  # the trainer's section, tracked_stats included
    events = read_events(str(log))
    assert len([e for e in events if e.key == "tracked_stats"]) == 6 + 3  # 6 steps, 3 evals
    (stop,) = [e for e in events if e.key == "run_stop"]
    assert stop.time_ms == load(RunLayout(run_dir).manifest).row(4).timestamp_ms
    assert compliance(str(log), division="open", log_dir=str(tmp_path)).ok
    again = log.read_bytes()
    finalize(run_dir)
    assert log.read_bytes() == again


def test_only_069_is_incomplete_not_success(tmp_path, monkeypatch):
    run_dir, _ = _decided(tmp_path, monkeypatch, {2: "0.69"})
    result = finalize(run_dir)
    assert result.status == "incomplete" and result.step is None
    assert not [e for e in read_events(RunLayout(run_dir).mllog(1)) if e.key == "run_stop"]


def test_a_log_ended_by_nemo_rls_driver_is_refused(tmp_path, monkeypatch):
    run_dir, ckpt = trained(tmp_path, monkeypatch)
    view = view_of(ckpt, tmp_path / "view", 2, 3)
    log = Path(RunLayout(run_dir).mllog(1))
    monkeypatch.setenv("MLPERF_MLLOG_FILE", str(log))  # the reference's own driver, in place
    assert nemo_evaluator.main(["--checkpoint-root", str(view), "--log-dir", str(tmp_path),
                                "--accuracy", "0.69"]) == 0  # fmt: skip
    before = log.read_bytes()
    with pytest.raises(FinalizeInputError, match=r"run_stop \(line \d+, status success"):
        finalize(run_dir)
    p = run_cli("finalize", run_dir)
    line = assert_one_invalid_line(p, "run_stop (line", "rcpflow run reset", "clean copy")
    assert "success" in line
    assert log.read_bytes() == before
    # one answer: the import of a step it decides says what finalize says, --reopen or not
    for reopen in (False, True):
        with pytest.raises(EvalImportError) as e:
            import_eval(run_dir, 2, str(log), fmt="nemo-rl-mllog", reopen=reopen)
        assert "rcpflow run reset" in str(e.value) and "--reopen" not in str(e.value)
    assert not Path(RunLayout(run_dir).summary(2)).exists()
    now = run_status(run_dir).finalize  # status predicts exactly that refusal
    assert now is not None and now.status == "refused"
    assert now.reason in line and "run_stop (line" in now.reason


def test_a_random_logged_seed_finalizes_its_own_log(tmp_path, monkeypatch):
    # NeMo-RL's launcher draws the seed: seed_1.out states 2115446333; finalize reads seed_1.out.
    run_dir, ckpt = trained(tmp_path, monkeypatch, logged_seed=2115446333)
    for step, acc in {2: "0.5", 3: "0.75"}.items():
        log = evaluate_nemo(tmp_path, monkeypatch, ckpt, step, "--accuracy", acc)
        import_eval(run_dir, step, str(log), fmt="nemo-rl-mllog")
    result = finalize(run_dir)
    assert (result.status, result.step) == ("success", 3)
    events = read_events(RunLayout(run_dir).mllog(1))
    assert [e.value for e in events if e.key == "seed"] == [2115446333]


def test_the_summary_claims_the_logs_eval_samples_and_finalize_refuses_256(tmp_path, monkeypatch):
    run_dir, ckpt = trained(tmp_path, monkeypatch)
    log = evaluate_nemo(tmp_path, monkeypatch, ckpt, 2, "--accuracy", str(184 / 256))
    training = Path(RunLayout(run_dir).mllog(1))
    text = training.read_text()
    training.write_text(
        text.replace('"eval_samples", "value": 251', '"eval_samples", "value": 256')
    )
    with pytest.raises(EvalImportError, match=r"step 2: .*instances: 256, the benchmark"):
        import_eval(run_dir, 2, str(log), fmt="nemo-rl-mllog")
    assert not Path(RunLayout(run_dir).summary(2)).exists()
    result = finalize(run_dir)  # never a run_stop on a section the checker rejects
    assert result.status == "incomplete" and "eval_samples 256" in result.reason
    training.write_text(text)
    imported = import_eval(run_dir, 2, str(log), fmt="nemo-rl-mllog")
    assert (imported.summary.instances, imported.summary.expected_attempts) == (251, 1004)


def test_nemo_rls_reduced_train_loss_is_the_plotted_loss(tmp_path, monkeypatch):
    from tasks.views.convergence import tracked_training

    run_dir, _ = trained(tmp_path, monkeypatch)
    points = tracked_training(read_events(RunLayout(run_dir).mllog(1)))
    assert [(p.step, p.loss) for p in points] == [(s, 1.0 / s) for s in range(1, 7)]
