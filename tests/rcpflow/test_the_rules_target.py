"""The target is the rules' 0.69 (both divisions): rows, summaries or trainers stating another
one are invalid input, named, and never move a verdict."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from rcpflow_cli import run_cli

from devtools.synthetic_run import make_run, passing_run, write_eval
from rcpflow import recipe
from rcpflow.cli.status import run_status
from rcpflow.records.summary import read_summary
from rcpflow.trainer.recorder import TrainingRecorder
from rcpflow.verdict.eval_import import EvalImportError, import_eval
from rcpflow.verdict.finalize import finalize


def _rewrite_rows(manifest: str, **fields: object) -> None:
    rows = [json.loads(line) for line in Path(manifest).read_text().splitlines()]
    Path(manifest).write_text("".join(json.dumps({**r, **fields}) + "\n" for r in rows))


@pytest.mark.parametrize("division", recipe.DIVISIONS)
def test_a_row_stating_another_target_is_invalid(tmp_path, division):
    run = make_run(str(tmp_path / "run"), max_steps=20, division=division)
    _rewrite_rows(run.layout.manifest, target_accuracy=0.95)
    p = run_cli("manifest", "validate", run.layout.manifest)
    assert p.returncode == 1
    assert p.stderr.strip().endswith(
        "eval_checkpoints.jsonl: line 1: target_accuracy 0.95 is not the benchmark's 0.69"
    )
    p = run_cli("finalize", run.run_dir)
    assert p.returncode == 1 and "is not the benchmark's 0.69" in p.stderr


def test_a_summary_stating_another_target_is_invalid_and_never_a_pass(tmp_path):
    # pass@4 0.75 is above 0.69: a summary saying target 0.95 must not turn it into a fail
    run = make_run(str(tmp_path / "run"), max_steps=20, accuracies={18: 0.75})
    s = read_summary(run.layout.summary(18))
    bad = dataclasses.replace(s, target_accuracy=0.95, target_reached=False)
    Path(run.layout.summary(18)).write_text(bad.to_json())
    status = run_status(run.run_dir)
    assert status.steps[0].summary == "invalid" and status.steps[0].gate == "evaluate"
    assert "target_accuracy: 0.95 is not the benchmark's 0.69" in status.steps[0].problems
    result = finalize(run.run_dir)
    assert result.status == "incomplete" and "0.95 is not the benchmark's 0.69" in result.reason


def test_import_of_a_summary_stating_another_target_is_refused(tmp_path):
    run = passing_run(tmp_path)
    source = tmp_path / "summary.json"
    d = json.loads(Path(run.layout.summary(19)).read_text())
    source.write_text(json.dumps({**d, "target_accuracy": 0.55}))
    with pytest.raises(EvalImportError, match=r"target_accuracy: 0.55 is not the benchmark's 0.69"):
        import_eval(run.run_dir, 19, str(source))


def test_a_recorder_with_another_target_is_refused(tmp_path):
    hp = recipe.hyperparameters("open", 256, 20)
    with pytest.raises(ValueError, match=r"target_accuracy 0.95 is not the benchmark's 0.69"):
        TrainingRecorder(
            str(tmp_path), seed=1, hyperparameters=hp, val_start_at=18, target_accuracy=0.95
        )


def test_the_gate_uses_the_rules_target_whatever_a_row_object_says(tmp_path):
    from rcpflow.verdict.gate import passes

    run = make_run(str(tmp_path / "run"), max_steps=20, accuracies={18: 0.75})
    s = read_summary(run.layout.summary(18))
    assert passes(s, dataclasses.replace(run.row(18), target_accuracy=0.95))
    write_eval(run, 19, 0.6)  # below 0.69 fails even against a row object saying 0.5
    row = dataclasses.replace(run.row(19), target_accuracy=0.5)
    assert not passes(read_summary(run.layout.summary(19)), row)
