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


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('step,seed_1\n1,"0.5\n2",0.3\n', "line 2: not a CSV row"),  # a quoted cell spanning lines
        ("step,seed_\u00b2\n1,0.5\n", "line 1: column 'seed_\u00b2' is not seed_<n>"),
        ("step,seed_1\n1,0.5\x00\n", "line 2: seed_1"),
        ("step,seed_1\n1," + "9" * 200_000 + "\n", "line 2: not a CSV row"),
        ("step,seed_1,seed_01\n1,0.5,0.5\n", "twice"),
        ("step,seed_99999999999999999999\n1,0.5\n", "is not seed_<n>"),
    ],
)
def test_an_unusual_curve_is_one_named_line(text: str, named: str) -> None:
    with pytest.raises(RehearsalInputError) as refused:
        parse_curve(text, "c.csv")
    assert str(refused.value).startswith("c.csv: ") and named in str(refused.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [("step_seconds", "1e308"), ("step_seconds", "1" + "0" * 400), ("eval_chips", "1" + "0" * 30)],
)
def test_a_profile_beyond_its_bounds_is_one_named_line(key: str, value: str) -> None:
    table = {"step_seconds": "185", "eval_seconds": "1700", "train_chips": "1", "eval_chips": "1"}
    table[key] = value
    with pytest.raises(RehearsalInputError, match=f"p.toml: {key} "):
        parse_profile("\n".join(f"{k} = {v}" for k, v in table.items()), "p.toml")
