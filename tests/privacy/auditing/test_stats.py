"""The auditor's statistics (``service.privacy.auditing.stats``): Clopper–Pearson bounds and
the ε lower bound, on mechanisms whose ε is known exactly. These test the tester, so their
randomness is seeded numpy (deterministic); the false-failure rate beside each threshold is the
chance that a correct tester fails it for a random seed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from service.privacy.auditing.stats import cp_lower, cp_upper, epsilon_bound, lower_bound


def test_clopper_pearson_matches_its_definition() -> None:
    """At the bound, the binomial tail equals alpha (the interval's defining equation)."""
    n, alpha = 1000, 0.025
    for k in (1, 10, 500, 999):
        lo, hi = cp_lower(k, n, alpha), cp_upper(k, n, alpha)
        assert lo < k / n < hi
        assert stats.binom.sf(k - 1, n, lo) == pytest.approx(alpha, rel=1e-6)  # P[X >= k | lo]
        assert stats.binom.cdf(k, n, hi) == pytest.approx(alpha, rel=1e-6)  # P[X <= k | hi]
    assert cp_lower(0, n, alpha) == 0.0 and cp_upper(n, n, alpha) == 1.0
    assert cp_upper(0, n, alpha) == pytest.approx(1 - alpha ** (1 / n))


@pytest.mark.slow  # 20,000 seeded binomial draws
def test_clopper_pearson_coverage() -> None:
    """Over 20,000 seeded binomial draws, the one-sided bounds miss p at most alpha of the
    time (binomial: at alpha = 0.05 the miss count's mean is <= 1000, its s.d. about 31; the
    threshold 1150 leaves 4.8 s.d.: false-failure rate < 2e-6)."""
    rng = np.random.default_rng(7)
    n, p, alpha = 200, 0.03, 0.05
    ks = rng.binomial(n, p, size=20_000)
    lo_miss = sum(cp_lower(int(k), n, alpha) > p for k in ks)
    hi_miss = sum(cp_upper(int(k), n, alpha) < p for k in ks)
    assert lo_miss <= 1150 and hi_miss <= 1150


def test_epsilon_bound_subtracts_delta_and_is_never_negative() -> None:
    assert epsilon_bound(hits_1=500, hits_0=500, n_1=1000, n_0=1000, delta=0.0, alpha=0.05) == 0.0
    big = epsilon_bound(hits_1=900, hits_0=10, n_1=1000, n_0=1000, delta=0.0, alpha=0.05)
    with_delta = epsilon_bound(hits_1=900, hits_0=10, n_1=1000, n_0=1000, delta=0.5, alpha=0.05)
    assert 0.0 < with_delta < big < math.log(90)  # the point estimate, shrunk by the CP bounds
    assert epsilon_bound(hits_1=10, hits_0=0, n_1=1000, n_0=1000, delta=0.5, alpha=0.05) == 0.0


def _randomised_response(
    eps: float, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Randomised response on one bit (exactly ε-DP): 1 with probability e^ε/(1 + e^ε) on
    input 1, 1/(1 + e^ε) on input 0."""
    p = math.exp(eps) / (1 + math.exp(eps))
    return (rng.random(n) < 1 - p).astype(float), (rng.random(n) < p).astype(float)


def test_lower_bound_is_valid_and_tight_on_randomised_response() -> None:
    """ε = 1 exactly: over 40 seeded audits at 95 % the bound passes 1 rarely (each does with
    probability <= 5 %, and in fact far less: the count of the 40 above 1 is Binomial(40,
    <= 0.05); the threshold 9 has false-failure rate < 3e-5), and its median is within 0.1 of
    1 (200,000 releases a side: the CP half-width on ln is about 0.03)."""
    rng = np.random.default_rng(11)
    bounds = []
    for _ in range(40):
        s0, s1 = _randomised_response(1.0, 200_000, rng)
        bounds.append(lower_bound(s0, s1, delta=0.0, confidence=0.95).epsilon)
    assert sum(b > 1.0 for b in bounds) <= 9
    assert 0.9 < float(np.median(bounds)) <= 1.0


def test_lower_bound_sees_either_direction() -> None:
    """The favoured input may be either one: swapping the samples gives the same bound
    (each threshold set is tried as evidence for either input)."""
    rng = np.random.default_rng(3)
    s0, s1 = _randomised_response(2.0, 50_000, rng)
    a = lower_bound(s0, s1, delta=0.0, confidence=0.95)
    b = lower_bound(s1, s0, delta=0.0, confidence=0.95)
    assert a.epsilon > 1.7 and b.epsilon > 1.7
    assert a.rejection.favours_one != b.rejection.favours_one


def test_a_data_independent_mechanism_bounds_zero() -> None:
    """The same distribution on both inputs: ε = 0; at 1 − 1e-6 confidence the bound is 0
    unless the tester is invalid (false-failure rate 1e-6 by construction)."""
    rng = np.random.default_rng(5)
    s0, s1 = rng.laplace(size=100_000), rng.laplace(size=100_000)
    assert lower_bound(s0, s1, delta=0.0, confidence=1 - 1e-6).epsilon == 0.0


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="confidence"):
        lower_bound(np.zeros(10), np.zeros(10), delta=0.0, confidence=1.0)
    with pytest.raises(ValueError, match="at least 4"):
        lower_bound(np.zeros(2), np.zeros(2), delta=0.0, confidence=0.9)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        cp_lower(5, 4, 0.1)
