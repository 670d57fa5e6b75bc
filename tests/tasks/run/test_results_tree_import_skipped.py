"""The run DAG's tree import names what the walk skipped (issue 29): a symlinked step folder
leading out of the tree, or dangling, is a warning and in the task's result, never dropped
silently; a tree where everything was skipped says so in its one error line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from devtools.synthetic_run import passing_run
from tasks.run import results_tree_import
from tasks.run.spec import ParamError


def _run(monkeypatch: pytest.MonkeyPatch, run_dir: str, tree: Path) -> dict:
    context = {"params": {"eval_tree": str(tree), "eval_times_from": None}}
    monkeypatch.setattr(results_tree_import, "get_current_context", lambda: context)
    return results_tree_import.import_eval_tree.function(run_dir)


def test_a_tree_of_skipped_steps_is_named(tmp_path, monkeypatch, caplog):
    run = passing_run(tmp_path)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "step_18").symlink_to(tmp_path / "elsewhere")  # dangling, and out of the tree
    with caplog.at_level(logging.WARNING), pytest.raises(ParamError) as refused:
        _run(monkeypatch, run.run_dir, tree)
    assert "1 entries skipped, first: " in str(refused.value)
    assert str(tree / "step_18") in str(refused.value)
    assert any(str(tree / "step_18") in r.getMessage() for r in caplog.records)
