"""pass@k against brute-force enumeration of every k-subset of the attempts."""

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rcpflow.records.passk import mean_pass_at_k, pass_at_k


def brute_force(n: int, c: int, k: int) -> float:
    attempts = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(attempts[i] for i in s) for s in subsets) / len(subsets)


@given(
    st.integers(1, 10).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_matches_enumeration(nck):
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12)


def test_closed_form_small():
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - math.comb(7, 4) / math.comb(10, 4))


def test_stable_for_large_n():
    # factorials of 10**6 would overflow a float; the product form does not
    got = pass_at_k(1_000_000, 1, 4)
    assert got == pytest.approx(4e-6, rel=1e-6)
    assert 0.0 <= pass_at_k(10**6, 10**5, 1000) <= 1.0


@pytest.mark.parametrize(("n", "c", "k"), [(3, 1, 4), (4, 5, 4), (4, -1, 4), (4, 1, 0)])
def test_rejects_impossible(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_over_instances():
    assert mean_pass_at_k([(4, 0), (4, 1), (4, 4)], 4) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        mean_pass_at_k([], 4)
