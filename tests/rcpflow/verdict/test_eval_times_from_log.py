"""Eval times of a Tunix-format import from the evaluating pipeline's own MLLOG
(`--eval-times-from LOG`): its eval_start/eval_stop of the checkpoint's samples_count, exactly
one of each, or the import is refused naming the log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_records import FIXTURES
from rcpflow_cli import run_cli

from devtools.synthetic_run import make_run
from rcpflow.records.mllog import EventRenderer
from rcpflow.records.summary import read_summary
from rcpflow.verdict.eval_import import (
    EvalImportError,
    eval_times_from_log,
    import_eval,
    import_results_tree,
)


@pytest.fixture
def run(tmp_path):
    return make_run(str(tmp_path / "run"), max_steps=20)


def _tunix(run, step: int, root: Path, stamp: str = "20260929T060823Z-f604fb47") -> Path:
    d = json.loads((FIXTURES / "summary_full.json").read_text())
    row = run.row(step)
    d.update(
        checkpoint_step=step,
        checkpoint_timestamp_ms=row.timestamp_ms,
        samples_count=row.samples_count,
    )
    path = root / f"step_{step}" / stamp / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(d))
    return path


def _log(path: Path, events: list[tuple[str, int, int]]) -> str:
    """(key, samples_count, time_ms) as eval_start/eval_stop lines of the official API."""
    r = EventRenderer()
    kind = {"eval_start": "start", "eval_stop": "end"}
    lines = [r.render(kind[k], k, None, {"samples_count": s}, t) for k, s, t in events]
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_times_come_from_the_rows_samples_count(run, tmp_path):
    row = run.row(19)
    t = row.timestamp_ms + 10_000
    log = _log(
        tmp_path / "p.log",
        [("eval_start", run.row(18).samples_count, t - 5), ("eval_start", row.samples_count, t),
         ("eval_stop", row.samples_count, t + 1697_760)],
    )  # fmt: skip
    assert eval_times_from_log(log, row) == (t, t + 1697_760)
    source = _tunix(run, 19, tmp_path / "tree")
    imported = import_eval(run.run_dir, 19, str(source), eval_times_from=log)
    assert imported.times_from == "log"
    s = read_summary(imported.summary_path)
    assert (s.eval_start_ms, s.eval_stop_ms) == (t, t + 1697_760)
    assert s.validation_time_s == pytest.approx(1697.76)


@pytest.mark.parametrize(
    ("events", "named"),
    [
        ([], "0 eval_start events with samples_count 4864 (lines: none)"),
        ([("eval_start", 4864, 1)], "0 eval_stop events"),
        (
            [("eval_start", 4864, 1), ("eval_start", 4864, 2), ("eval_stop", 4864, 3)],
            "2 eval_start events with samples_count 4864 (lines: 1, 2)",
        ),
        ([("eval_start", 4864, 9), ("eval_stop", 4864, 3)], "eval_stop (line 2) 3 is before"),
    ],
)
def test_missing_ambiguous_or_backwards_times_are_refused(run, tmp_path, events, named):
    log = _log(tmp_path / "p.log", events)
    with pytest.raises(EvalImportError, match=r"p\.log: step 19: ") as refused:
        eval_times_from_log(log, run.row(19))
    assert named in str(refused.value)


def test_a_log_before_the_checkpoint_is_refused_and_nothing_is_written(run, tmp_path):
    row = run.row(19)
    log = _log(
        tmp_path / "p.log",
        [("eval_start", row.samples_count, row.timestamp_ms - 1),
         ("eval_stop", row.samples_count, row.timestamp_ms + 5)],
    )  # fmt: skip
    with pytest.raises(EvalImportError, match=r"eval_start_ms: \d+ is before the checkpoint"):
        import_eval(run.run_dir, 19, str(_tunix(run, 19, tmp_path / "t")), eval_times_from=log)
    assert not Path(run.layout.summary(19)).exists()


def test_the_cli_and_a_tree_take_the_log(run, tmp_path):
    tree = tmp_path / "eval_results"
    for step in (18, 19):
        _tunix(run, step, tree)
    t18, t19 = run.row(18).timestamp_ms + 50, run.row(19).timestamp_ms + 50
    s18, s19 = run.row(18).samples_count, run.row(19).samples_count
    log = _log(
        tmp_path / "p.log",
        [("eval_start", s18, t18), ("eval_stop", s18, t18 + 7),
         ("eval_start", s19, t19), ("eval_stop", s19, t19 + 9)],
    )  # fmt: skip
    result = import_results_tree(run.run_dir, str(tree), eval_times_from=log)
    assert result.all_imported
    assert read_summary(run.layout.summary(19)).eval_stop_ms == t19 + 9
    p = run_cli("eval", "import", run.run_dir, "--from-tree", str(tree), "--eval-times-from", log)
    assert p.returncode == 0, p.stderr
    assert "eval times from the log" in p.stdout and f"from {log}" in p.stdout
    source = str(tree / "step_18" / "20260929T060823Z-f604fb47" / "summary.json")
    p = run_cli("eval", "import", run.run_dir, "--step", "18", source, "--eval-times-from", log)
    assert p.returncode == 0 and p.stdout.startswith("step 18: imported tunix-summary"), p.stderr
    both = ("--eval-times-from", log, "--eval-start-ms", "1", "--eval-stop-ms", "2")
    p = run_cli("eval", "import", run.run_dir, "--step", "18", source, *both)
    assert p.returncode == 2 and "not both" in p.stderr
