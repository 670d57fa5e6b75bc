"""The unbiased pass@k estimator (Chen et al., 2021): ``1 - C(n-c, k) / C(n, k)``.

Computed as a product of ratios, never with factorials, so it is exact enough and cannot
overflow for any n. Failed and missing attempts are simply not successes: the caller passes
``c`` = resolved attempts and ``n`` = attempts that were *expected*.
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k of the n attempts, drawn without replacement, passed."""
    if k <= 0 or n < k:
        raise ValueError(f"pass@k needs 0 < k <= n, got n={n}, k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    prob_all_fail = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_fail *= 1.0 - k / i
    return 1.0 - prob_all_fail


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """pass@k averaged over instances, each given as (n attempts expected, c resolved)."""
    if not counts:
        raise ValueError("pass@k over zero instances is undefined")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
