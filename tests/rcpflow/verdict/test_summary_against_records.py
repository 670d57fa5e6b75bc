"""A summary beside (or imported with) the attempt records it was built from must state the
counts they give: completed, missing, error and resolved attempts, instances, status_counts and
pass@k. A mismatch is invalid and never a pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from eval_records import START, STOP, deepswe_lines, write_lines
from rcpflow_cli import run_cli

from devtools.synthetic_run import make_run
from rcpflow.cli.status import run_status
from rcpflow.verdict.eval_import import EvalImportError, import_eval
from rcpflow.verdict.finalize import finalize


@pytest.fixture
def run(tmp_path):
    return make_run(str(tmp_path / "run"), max_steps=20)


def _full_summary(run, tmp_path) -> dict:
    """The summary of all 251 tasks' records (pass@4 150/251)."""
    source = write_lines(tmp_path / "all.jsonl", deepswe_lines())
    import_eval(run.run_dir, 18, source, eval_times=(START, STOP))
    d = json.loads(Path(run.layout.summary(18)).read_text())
    shutil.rmtree(Path(run.layout.eval_dir(18)))
    return d


def test_a_summary_claiming_more_attempts_than_its_records_is_invalid(run, tmp_path):
    d = _full_summary(run, tmp_path)
    folder = tmp_path / "eval"
    (folder / "summary.json").parent.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(d))
    # 720 records of 180 tasks: 71 tasks without a record, yet pass@k is the same (the unsolved
    # tasks are the missing ones)
    write_lines(folder / "attempts" / "attempts.jsonl", deepswe_lines(range(180)))
    p = run_cli("eval", "import", run.run_dir, "--step", "18", str(folder / "summary.json"))
    assert p.returncode == 1, p.stdout
    assert "completed_attempts: 1004 but" in p.stderr and "gives 720" in p.stderr
    assert "missing_attempts: 0 but" in p.stderr and "status_counts:" in p.stderr
    assert not Path(run.layout.summary(18)).exists()


def test_a_summary_beside_records_that_disagree_is_not_a_pass(run, tmp_path):
    d = _full_summary(run, tmp_path)
    Path(run.layout.summary(18)).parent.mkdir(parents=True)
    Path(run.layout.summary(18)).write_text(json.dumps(d))
    write_lines(Path(run.layout.attempts_dir(18)) / "attempts.jsonl", deepswe_lines(range(180)))
    step = run_status(run.run_dir).steps[0]
    assert step.summary == "invalid" and step.gate == "evaluate"
    assert any(p.startswith("completed_attempts: 1004 but") for p in step.problems)
    assert finalize(run.run_dir).status == "incomplete"


def test_status_counts_that_disagree_with_the_records_are_invalid(run, tmp_path):
    d = _full_summary(run, tmp_path)
    counts = d["status_counts"]
    moved = min(counts["SUCCEEDED"], 3)
    d["status_counts"] = {**counts, "SUCCEEDED": counts["SUCCEEDED"] - moved, "TIMEOUT": moved}
    folder = tmp_path / "eval"
    (folder / "summary.json").parent.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(d))
    write_lines(folder / "attempts" / "attempts.jsonl", deepswe_lines())
    with pytest.raises(EvalImportError, match=r"status_counts: .* but .* gives"):
        import_eval(run.run_dir, 18, str(folder / "summary.json"))


def test_a_summary_that_matches_its_records_imports(run, tmp_path):
    d = _full_summary(run, tmp_path)
    folder = tmp_path / "eval"
    (folder / "summary.json").parent.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(d))
    write_lines(folder / "attempts" / "attempts.jsonl", deepswe_lines())
    result = import_eval(run.run_dir, 18, str(folder / "summary.json"))
    assert result.summary.completed_attempts == 1004
    assert run_status(run.run_dir).steps[0].summary == "valid"
