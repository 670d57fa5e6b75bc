"""`rcpflow.planning.rehearsal`: the job profile and the pass@4 curve, the shipped ones and bad
ones."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from rcpflow.planning.rehearsal import (
    RehearsalInputError,
    load_curve,
    load_profile,
    parse_curve,
    parse_profile,
    solved_tasks,
)
from rcpflow.records.rcp_reference import reference_point

SHIPPED = Path(__file__).resolve().parents[3] / "tpu_jobs" / "rehearsal"


def test_the_shipped_profile_is_the_seeds_figures() -> None:
    p = load_profile(str(SHIPPED / "profile.toml"))
    assert (p.step_seconds, p.eval_seconds, p.train_chips, p.eval_chips) == (185, 1700, 128, 64)


def test_the_shipped_curve_first_passes_near_the_reference_and_stays_above() -> None:
    curve = load_curve(str(SHIPPED / "curve.csv"))
    assert curve.seeds == (1, 2, 3) and curve.steps == 60
    ref = reference_point(256)
    assert ref is not None and ref.step == 18  # the RCP file's reference: the first evaluation
    firsts = {}
    for seed in curve.seeds:
        first = curve.first_pass(seed, 18, 60)
        assert first is not None and 18 <= first <= 24
        firsts[seed] = first
        # below the target before it, above after: the first pass is the only crossing
        assert all(curve.pass_at_4(seed, s) <= 0.69 for s in range(1, first))
        assert all(curve.pass_at_4(seed, s) > 0.69 for s in range(first, 61))
        # not a straight line: some step is below the one before it
        values = [curve.values[seed][s] for s in range(60)]
        assert any(b < a for a, b in itertools.pairwise(values))
    assert firsts == {1: 20, 2: 23, 3: 19}


def test_a_pass_at_4_is_a_whole_number_of_solved_tasks() -> None:
    assert solved_tasks(0.0) == 0 and solved_tasks(1.0) == 251
    assert solved_tasks(174 / 251) == 174
    assert solved_tasks(173.5 / 251) == 174  # half a task rounds up
    curve = parse_curve("step,seed_7\n1,0.69\n", "c.csv")
    assert curve.pass_at_4(7, 1) == 173 / 251  # 0.69 x 251 = 173.19: 173 tasks, below target


# A curve or a profile that cannot be used: the message names the file, then the line, column
# or key.
@pytest.mark.parametrize(
    ("parse", "text", "where"),
    [
        (parse_curve, "", "no header"),
        (parse_curve, "stp,seed_1\n1,0.5\n", "line 1: header"),
        (parse_curve, "step,seed_x\n1,0.5\n", "column 'seed_x'"),
        (parse_curve, "step,seed_1,seed_1\n1,0.5,0.5\n", "twice"),
        (parse_curve, "step,seed_1\n1,0.5\n3,0.5\n", "line 3: step '3', expected 2"),
        (parse_curve, "step,seed_1\n1,1.5\n", "line 2: seed_1 '1.5'"),
        (parse_curve, "step,seed_1\n1,nan\n", "line 2: seed_1 'nan'"),
        (parse_curve, "step,seed_1\n1\n", "line 2: 1 values"),
        (parse_curve, "# only a comment\nstep,seed_1\n", "no steps"),
        (
            parse_profile,
            "step_seconds = 1\neval_seconds = 1\ntrain_chips = 1\n",
            "eval_chips is missing",
        ),
        (
            parse_profile,
            "step_seconds = 0\neval_seconds = 1\ntrain_chips = 1\neval_chips = 1\n",
            "step_seconds",
        ),
        (
            parse_profile,
            'step_seconds = "1"\neval_seconds = 1\ntrain_chips = 1\neval_chips = 1\n',
            "number",
        ),
        (
            parse_profile,
            "step_seconds = 1\neval_seconds = 1\ntrain_chips = 1.5\neval_chips = 1\n",
            "integer",
        ),
        (
            parse_profile,
            "step_seconds = 1\neval_seconds = 1\ntrain_chips = 1\neval_chips = 1\nx = 1\n",
            "'x'",
        ),
        (parse_profile, "step_seconds = \n", "not TOML"),
    ],
)
def test_a_bad_input_names_the_file_and_where(
    parse: Callable[[str, str], object], text: str, where: str
) -> None:
    with pytest.raises(RehearsalInputError) as e:
        parse(text, "in.txt")
    assert str(e.value).startswith("in.txt: ") and where in str(e.value)


def test_a_curve_knows_its_seeds_and_steps() -> None:
    curve = parse_curve("# c\nstep,seed_1\n1,0.1\n2,0.8\n", "c.csv")
    assert curve.first_pass(1, 1, 2) == 2
    with pytest.raises(RehearsalInputError, match="no seed 2"):
        curve.solved(2, 1)
    with pytest.raises(RehearsalInputError, match="no step 3"):
        curve.solved(1, 3)
