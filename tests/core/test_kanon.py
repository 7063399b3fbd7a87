"""The Li–Qardaji–Su calculator (docs/ARCHITECTURE.md, "Annotation queues"): hand-computable
cases, a brute-force check in
exact rational arithmetic, monotonicity, the inverses, and the input bounds."""

from __future__ import annotations

import math
import time
from decimal import Context, Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from service.core.annotation import sampled_kanon as kanon


def gamma_bracket(beta: float, epsilon: float) -> tuple[Fraction, Fraction]:
    """γ = 1 − (1−β)e^−ε between two rationals 1e-58 apart (decimal's exp is correctly
    rounded at 60 digits), independent of the module's own comparison."""
    e = Fraction(Context(prec=60).exp(Decimal(-epsilon)))
    slack = e / 10**59
    one_minus = 1 - Fraction(beta)
    return 1 - one_minus * (e + slack), 1 - one_minus * (e - slack)


def exact_delta(
    k: int, beta: float, epsilon: float, n_hi: int, *, g: Fraction | None = None
) -> float:
    """By the definition, in exact rational arithmetic: the max over every 1 ≤ N ≤ n_hi of
    P[Bin(N, β) = j] summed over the released counts j ≥ k with j > γN (strictly: at j = γN
    the likelihood ratio is e^ε exactly). γ is the exact rational ``g`` when given (the
    boundary, γ = β(2−β)), else bracketed; a j the bracket cannot place fails the test."""
    lo, hi = (g, g) if g is not None else gamma_bracket(beta, epsilon)
    # in integers: β = p/q, so P[Bin(N, β) = j] = C(N, j)·p^j·(q−p)^(N−j) / q^N; for an
    # integer j, j > γN exactly when j > ⌊γN⌋ (the same for ≤)
    p, q = Fraction(beta).numerator, Fraction(beta).denominator
    p_pow, rest_pow = [1], [1]
    for _ in range(n_hi):
        p_pow.append(p_pow[-1] * p)
        rest_pow.append(rest_pow[-1] * (q - p))
    best = Fraction(0)
    for n in range(1, n_hi + 1):
        floor_lo = lo.numerator * n // lo.denominator
        floor_hi = hi.numerator * n // hi.denominator
        tail = 0
        for j in range(k, n + 1):
            if j > floor_hi:
                tail += math.comb(n, j) * p_pow[j] * rest_pow[n - j]
            else:
                assert j <= floor_lo, (j, n, "undecided")
        best = max(best, Fraction(tail, q**n))
    return float(best)


def covers(beta: float, epsilon: float) -> bool:
    """ε ≥ −ln(1−β) exactly: (1−β)·e^ε ≥ 1, with e^ε bracketed at 60 digits (decisive)."""
    e = Fraction(Context(prec=60).exp(Decimal(epsilon)))
    one_minus = 1 - Fraction(beta)
    lo, hi = one_minus * e * (1 - Fraction(1, 10**59)), one_minus * e * (1 + Fraction(1, 10**59))
    assert lo >= 1 or hi < 1, "undecided"
    return lo >= 1


# doubles β for which -log(1-β) is below -log1p(-β) (the old check refused them)
LOG_BELOW = [0.1338862374271648, 0.02903565428026424, 0.42900663015809776]


def test_issue_example_beta_01_eps_2_k_5_is_1e_5() -> None:
    # γ = 1 − 0.9·e^−2 = 0.878; n_m = ⌈5/γ − 1⌉ = 5; at n = 5 only j = 5 > 4.39: δ = β^5
    r = kanon.delta(k=5, beta=0.1, epsilon=2.0)
    assert r.n_m == 5 and r.n_max == 5
    assert r.delta == pytest.approx(1e-5, rel=1e-12)


def test_design_example_beta_01_k_10_eps_1_is_6_8e_08() -> None:
    # γ = 1 − 0.9/e = 0.6689; n_m = ⌈10/γ − 1⌉ = 14; γ·14 = 9.36: j = 10..14
    r = kanon.delta(k=10, beta=0.1, epsilon=1.0)
    by_hand = sum(math.comb(14, j) * 0.1**j * 0.9 ** (14 - j) for j in range(10, 15))
    assert r.n_m == 14 and r.n_max == 14
    assert r.delta == pytest.approx(by_hand, rel=1e-12)
    assert f"{r.delta:.1e}" == "6.8e-08"


@pytest.mark.parametrize(
    ("k", "beta", "epsilon"),
    [(1, 0.5, 0.7), (3, 0.3, 0.5), (10, 0.5, 1.0), (7, 0.05, 0.2), (20, 0.2, 0.4), (4, 0.9, 3.0)],
)
def test_matches_exact_rational_brute_force(k: int, beta: float, epsilon: float) -> None:
    r = kanon.delta(k=k, beta=beta, epsilon=epsilon)
    assert r.delta == pytest.approx(exact_delta(k, beta, epsilon, r.n_searched + 50), rel=1e-9)


@pytest.mark.parametrize("beta", [0.5, 0.25, 0.75, 0.125])
def test_ties_at_the_boundary_are_outside_the_tail(beta: float) -> None:
    # at ε = −ln(1−β), γ = β(2−β) is rational and γN is an integer for every N a multiple of
    # its denominator; j = γN must not be summed (issue 12, item 12: β = 0.5, ε = ln 2 was
    # over-stated by up to 67 %, 0.3125 for 0.1875 at k = 3)
    g = Fraction(beta) * (2 - Fraction(beta))
    for k in range(1, 25):
        r = kanon.delta(k=k, beta=beta, epsilon=-math.log(1 - beta))
        expect = exact_delta(k, beta, r.epsilon, r.n_searched + 40, g=g)
        assert r.delta == pytest.approx(expect, rel=1e-9), (k, r.delta, expect)
        # n_m = ⌈k/γ − 1⌉ exactly: the smallest N with γ(N+1) ≥ k
        assert r.n_m == next(n for n in range(1, 10**6) if g * (n + 1) >= k), k
    assert kanon.delta(k=3, beta=0.5, epsilon=math.log(2)).delta == pytest.approx(0.1875)
    assert kanon.delta(k=2, beta=0.5, epsilon=math.log(2)).delta == pytest.approx(0.25)


def test_near_ties_away_from_the_boundary_match_the_definition() -> None:
    # γN within 1e-9 of an integer off the boundary: decided exactly, both ways
    for beta, k in ((0.5, 4), (0.25, 3), (0.75, 6)):
        lo = kanon.covered_epsilon(beta=beta)
        for eps in (math.nextafter(lo, 1.0), lo + 1e-12, lo + 1e-9, lo * (1 + 1e-7)):
            r = kanon.delta(k=k, beta=beta, epsilon=eps)
            expect = exact_delta(k, beta, r.epsilon, r.n_searched + 40)
            assert r.delta == pytest.approx(expect, rel=1e-9), (beta, k, eps)


@settings(max_examples=200, deadline=None)
@given(beta=st.floats(kanon.BETA_MIN, kanon.BETA_MAX))
def test_epsilon_at_the_boundary_computed_in_floating_point_is_accepted(beta: float) -> None:
    lo = kanon.covered_epsilon(beta=beta)
    assert covers(beta, lo) and not covers(beta, math.nextafter(lo, 0.0))  # the smallest
    for eps in (-math.log(1 - beta), -math.log1p(-beta), float(-np.log(1 - beta))):
        r = kanon.delta(k=5, beta=beta, epsilon=eps)
        # the guarantee is stated at an ε the theorem covers: never below −ln(1−β)
        assert covers(beta, r.epsilon) and r.epsilon == max(eps, lo)
    # well below the boundary (far more than rounding) is refused, naming the field
    with pytest.raises(ValueError, match=r"epsilon must be >= -ln\(1-beta\)"):
        kanon.delta(k=5, beta=beta, epsilon=kanon.covered_epsilon(beta=beta) * (1 - 1e-12))


@pytest.mark.parametrize("beta", LOG_BELOW)
def test_log_of_one_minus_beta_is_accepted_everywhere(beta: float) -> None:
    eps = -math.log(1 - beta)
    assert eps < -math.log1p(-beta)  # the case the old check refused
    assert kanon.min_epsilon(beta=beta) <= eps
    r = kanon.delta(k=10, beta=beta, epsilon=eps)
    assert r.epsilon == kanon.covered_epsilon(beta=beta) and covers(beta, r.epsilon)
    assert kanon.smallest_k(beta=beta, epsilon=eps, target_delta=1e-3).delta <= 1e-3
    b = kanon.largest_beta(k=10, epsilon=eps, target_delta=0.5)
    assert covers(b.beta, eps) and b.epsilon == eps


def test_maximum_is_not_always_at_n_m() -> None:
    # the search must go past n_m for some inputs (docs/ARCHITECTURE.md, "Annotation queues")
    found = [
        (k, b, e)
        for k in (2, 5, 10, 30)
        for b in (0.1, 0.3, 0.5)
        for e in (0.7, 1.0, 2.0)
        if e >= kanon.min_epsilon(beta=b)
        and (r := kanon.delta(k=k, beta=b, epsilon=e)).n_max > r.n_m
    ]
    assert found


@pytest.mark.parametrize("rule", ["kl", "design"])
def test_stopping_rules_agree(rule: str) -> None:
    for b in (0.01, 0.1, 0.5, 0.7):
        for k in (1, 3, 10, 50):
            for e in (kanon.min_epsilon(beta=b), 1.0, 3.0):
                if e < kanon.min_epsilon(beta=b):
                    continue
                ref = kanon.delta(k=k, beta=b, epsilon=e, stopping="kl")
                got = kanon.delta(k=k, beta=b, epsilon=e, stopping=rule)  # type: ignore[arg-type]
                assert got.log_delta == ref.log_delta


def test_kl_rate_is_never_below_the_design_rate() -> None:
    for b in (0.001, 0.1, 0.5, 0.99):
        for e in (kanon.min_epsilon(beta=b), 1.0, 10.0):
            g = kanon.gamma(beta=b, epsilon=max(e, kanon.min_epsilon(beta=b)))
            assert kanon.chernoff_rate(g=g, beta=b) >= kanon.chernoff_rate(
                g=g, beta=b, rule="design"
            )


def test_log_space_is_exact_far_below_the_smallest_double() -> None:
    r = kanon.delta(k=1000, beta=0.01, epsilon=2.0)
    assert r.delta == 0.0 and math.isfinite(r.log_delta) and r.log_delta < -745
    # the deep tail against a plain log-sum-exp of every term
    n, m, b = 3000, 2000, 0.3
    j = list(range(m, n + 1))
    terms = [
        special.gammaln(n + 1)
        - special.gammaln(x + 1)
        - special.gammaln(n - x + 1)
        + x * math.log(b)
        + (n - x) * math.log1p(-b)
        for x in j
    ]
    expect = float(special.logsumexp(terms))
    got = float(kanon.log_binom_tail([n], [m], b)[0])
    assert expect < -600 and got == pytest.approx(expect, rel=1e-12)


def test_worst_case_inputs_stay_fast() -> None:
    t = time.perf_counter()
    for b, k in ((kanon.BETA_MIN, kanon.K_MAX), (kanon.BETA_MAX, kanon.K_MAX), (0.5, kanon.K_MAX)):
        r = kanon.delta(k=k, beta=b, epsilon=kanon.min_epsilon(beta=b))
        assert math.isfinite(r.log_delta)
    assert time.perf_counter() - t < 10


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 200),
    beta=st.floats(0.01, 0.9),
    e1=st.floats(0.0, 3.0),
    e2=st.floats(0.0, 3.0),
)
def test_delta_never_increases_with_epsilon(k: int, beta: float, e1: float, e2: float) -> None:
    lo = kanon.min_epsilon(beta=beta)
    a, b = sorted((lo + e1, lo + e2))
    assert (
        kanon.delta(k=k, beta=beta, epsilon=b).log_delta
        <= kanon.delta(k=k, beta=beta, epsilon=a).log_delta
    )


@settings(max_examples=60, deadline=None)
@given(
    k1=st.integers(1, 300), k2=st.integers(1, 300), beta=st.floats(0.01, 0.9), extra=st.floats(0, 3)
)
def test_delta_never_increases_with_k(k1: int, k2: int, beta: float, extra: float) -> None:
    eps = kanon.min_epsilon(beta=beta) + extra
    a, b = sorted((k1, k2))
    assert (
        kanon.delta(k=b, beta=beta, epsilon=eps).log_delta
        <= kanon.delta(k=a, beta=beta, epsilon=eps).log_delta
    )


def test_delta_is_not_monotone_in_beta_and_the_inverse_copes() -> None:
    # Thm 5's bound has downward jumps in β where γn crosses an integer (documented in
    # kanon.largest_beta); a smaller β is not always a smaller δ.
    lo = kanon.delta(k=1, beta=0.1751, epsilon=0.5)
    hi = kanon.delta(k=1, beta=0.1761, epsilon=0.5)
    assert hi.delta < lo.delta
    # ...but over a wide range it grows with β
    assert (
        kanon.delta(k=10, beta=0.5, epsilon=1.0).delta
        > kanon.delta(k=10, beta=0.1, epsilon=1.0).delta
    )


@pytest.mark.parametrize(("beta", "epsilon", "target"), [(0.1, 1.0, 1e-6), (0.5, 1.0, 1e-9)])
def test_smallest_k(beta: float, epsilon: float, target: float) -> None:
    r = kanon.smallest_k(beta=beta, epsilon=epsilon, target_delta=target)
    assert r.delta <= target
    assert r.k == 1 or kanon.delta(k=r.k - 1, beta=beta, epsilon=epsilon).delta > target


@pytest.mark.parametrize(
    ("k", "epsilon", "target"), [(10, 1.0, 1e-6), (5, 2.0, 1e-5), (30, 0.8, 1e-8)]
)
def test_largest_beta(k: int, epsilon: float, target: float) -> None:
    r = kanon.largest_beta(k=k, epsilon=epsilon, target_delta=target)
    assert r.delta <= target
    assert epsilon >= kanon.min_epsilon(beta=r.beta)
    # just above it the target is missed (it is not the cap here) ...
    assert kanon.delta(k=k, beta=r.beta * (1 + 1e-6), epsilon=epsilon).delta > target
    # ... and so does every point of the search grid below it
    cap = -math.expm1(-epsilon)
    for i in range(kanon.GRID):
        b = kanon.BETA_MIN + (cap - kanon.BETA_MIN) * i / (kanon.GRID - 1)
        if b < r.beta:
            assert kanon.delta(k=k, beta=b, epsilon=epsilon).delta <= target


def test_largest_beta_is_capped_by_epsilon() -> None:
    # β ≤ 1 − e^−ε: at ε = 0.1 that is 0.0952, and a loose target is met there
    r = kanon.largest_beta(k=50, epsilon=0.1, target_delta=0.5)
    assert r.beta == pytest.approx(-math.expm1(-0.1), rel=1e-12)
    assert kanon.min_epsilon(beta=r.beta) <= 0.1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"k": 10, "beta": 0.5, "epsilon": 0.5}, r"epsilon must be >= -ln\(1-beta\)"),
        ({"k": 10, "beta": 0.995, "epsilon": 10}, r"beta must be in \[0.001, 0.99\]"),
        ({"k": 0, "beta": 0.5, "epsilon": 1}, r"k must be an integer in \[1, 1000000\]"),
        ({"k": 10, "beta": 0.5, "epsilon": 51}, r"epsilon must be in \(0, 50.0\]"),
    ],
)
def test_bounds_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        kanon.delta(**kwargs)


def test_unreachable_targets_are_refused() -> None:
    with pytest.raises(ValueError, match="not reachable"):
        kanon.largest_beta(k=1, epsilon=0.01, target_delta=1e-12)
    with pytest.raises(ValueError, match="delta must be in"):
        kanon.smallest_k(beta=0.1, epsilon=1.0, target_delta=0.0)
