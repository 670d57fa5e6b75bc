"""The short-circuit decision reads persisted summaries, whatever order evaluations ran in."""

import itertools
import random
from pathlib import Path

from devtools.synthetic_run import make_run, rows_of, write_eval
from rcpflow.verdict.gate import lowest_passing, valid_summary


def test_skip_only_above_a_passing_lower_step(tmp_path):
    run = make_run(str(tmp_path), accuracies={18: 0.2, 20: 0.8, 22: 0.9})
    rows = rows_of(run.run_dir)
    assert lowest_passing(run.run_dir, rows, below=20) is None  # 20 itself is not "below"
    assert lowest_passing(run.run_dir, rows, below=21) == 20
    assert lowest_passing(run.run_dir, rows, below=24) == 20
    assert lowest_passing(run.run_dir, rows, below=19) is None


def test_any_completion_order_gives_the_same_decisions(tmp_path):
    accuracies = {18: 0.3, 19: 0.5, 20: 0.75, 21: 0.6, 22: 0.95}
    expected = None
    for order in random.Random(0).sample(list(itertools.permutations(accuracies)), 12):
        run = make_run(str(tmp_path / "-".join(map(str, order))))
        rows = rows_of(run.run_dir)
        for step in order:  # summaries appear in this order; decisions read them afterwards
            write_eval(run, step, accuracies[step])
        decisions = {r.step: lowest_passing(run.run_dir, rows, below=r.step) for r in rows}
        expected = expected or decisions
        assert decisions == expected
    assert expected == {18: None, 19: None, 20: None, 21: 20, 22: 20, 23: 20, 24: 20}


def test_invalid_or_unreadable_summaries_do_not_count(tmp_path):
    run = make_run(str(tmp_path), accuracies={18: 0.2})
    write_eval(run, 19, 0.99, fatal_error="restore failed")
    rows = rows_of(run.run_dir)
    assert valid_summary(run.run_dir, rows[1]) is None
    assert lowest_passing(run.run_dir, rows, below=24) is None
    Path(run.layout.summary(18)).write_text("{")
    assert valid_summary(run.run_dir, rows[0]) is None
