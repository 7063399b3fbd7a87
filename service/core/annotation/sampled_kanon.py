"""Differential privacy of β-sampling followed by k-anonymisation (docs/ARCHITECTURE.md,
"Annotation queues", and promise 5 of "Threat model and promises").

Li, Qardaji and Su, "On sampling, anonymization, and differential privacy, or,
k-anonymization meets differential privacy" (ASIACCS 2012; arXiv 1101.2604), Theorem 5:
sampling every record with probability β and then applying a strongly-safe k-anonymisation
(a data-independent generalisation, here the identity, then suppression of every class with
fewer than k records) is (ε, δ)-DP for every ε ≥ −ln(1−β), with

    γ   = (e^ε − 1 + β) / e^ε
    n_m = ⌈k/γ − 1⌉
    δ   = d(k, β, ε) = max_{n ≥ n_m} Σ_{j > γn}^{n} C(n, j) β^j (1−β)^{n−j}

The inner sum is the binomial tail P[Bin(n, β) > γn]. The maximum is not always at n_m, so n
is searched upward until a Chernoff bound on that tail falls below the best tail found:
every larger n has a smaller tail, so the maximum is known. ARX's
``EDDifferentialPrivacy`` uses the bound ``exp(−n(γ ln(γ/β) − (γ − β)))``; by default we
use the relative-entropy form of the same Chernoff bound, which is never looser and ends the
search much sooner for β near 1 (``chernoff_rate``); both give the same δ (tested).
Everything is computed in log space: the tail by scipy's binomial survival function (boost's
incomplete beta, accurate in relative terms) and, where that underflows, by log-sum-exp of the
log pmf, so tiny δ are exact too and the stopping rule never waits for a tail of 0.

δ decreases (weakly) in k and in ε. The inverses are searches: the smallest integer k that
reaches a target δ at (β, ε) (δ is monotone in k, so bisection is exact) and the largest β
(δ is not monotone in β: see ``largest_beta``).

**Which j are in the tail, exactly.** Let the class of the added record t hold N records in
D' = D ∪ {t}; its sampled count is Bin(N, β) under D' and Bin(N−1, β) under D, and a count j ≥ k
is released. The likelihood ratio of releasing j is (1−β)N / (N−j), which exceeds e^ε iff
(N−j)·e^ε < (1−β)N, i.e. iff j > γN; at j = γN the ratio is e^ε exactly and the DP inequality
holds with equality, so that j adds nothing to δ. The sum is over j > γN *strictly*, and
whether an integer j is above γN is decided exactly (``_Exp``): (N−j)·e^ε against (1−β)N, with
e^ε bracketed by a correctly rounded ``decimal`` exponential (40 digits, more if needed). The
inputs are doubles, i.e. rationals, and e^ε is transcendental for rational ε ≠ 0
(Lindemann–Weierstrass), so the two sides are never equal and the bracket always decides. γn is
near an integer (within 1e-9 relative, far above the 1e-15 error of the double γn) rarely but
systematically at the boundary ε = −ln(1−β), where γ = β(2−β) is rational (β = 0.5: γ = 3/4;
counting j = 3N/4 in the tail over-stated δ by up to 67 %: 0.3125 for 0.1875 at k = 3).
n_m = ⌈k/γ − 1⌉ is exact by the same comparison: the smallest N with (N+1−k)·e^ε ≥ (1−β)(N+1).

**ε at the boundary.** Theorem 5 needs ε ≥ −ln(1−β). ``covered_epsilon(β)`` is the smallest
double that is ≥ −ln(1−β), decided exactly as above ((1−β)·e^x ≥ 1). An ε a few rounding errors
below it is what any double evaluation of −ln(1−β) returns (``-log(1-beta)``, ``-log1p(-beta)``,
numpy, JavaScript), so it is accepted and read as the boundary: the guarantee is computed and
reported at ``effective_epsilon`` = max(ε, covered_epsilon(β)), never below what the theorem
gives. The slack is ``τ(β) = 2^-51·(1 + ε_β)`` (ε_β = covered_epsilon(β)); derivation: fl(1−β)
= (1−β)(1+η) with |η| ≤ u = 2^-53 moves ln by at most u(1+u); a faithfully rounded log adds at
most 2u·ε_β; covered_epsilon is at most one ulp (≤ 2u·ε_β) above −ln(1−β); in all
u + 4u·ε_β + O(u²) ≤ 4u(1 + ε_β) = τ(β). Anything lower is refused: it is not −ln(1−β) rounded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Context, Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Literal

import numpy as np
from scipy import special

BETA_MIN = 1e-3
BETA_MAX = 0.99
K_MAX = 1_000_000
EPSILON_MAX = 50.0
LOG_DELTA_MIN = math.log(1e-300)  # targets below this are refused
CHUNK = 4096
GRID = 33  # β grid of largest_beta
MAX_SEARCH_N = 2**16
"""The most n one δ evaluates (the search past n_m): the worst of the input box is about
18,500 (β = BETA_MIN, ε at its boundary, k = K_MAX; ``tests/core/test_kanon_bounds.py``),
0.1 s at the 5 µs or so an evaluation takes on one core (more when the core is shared)."""
SOLVE_BUDGET_N = 2**17
"""The most n a solve (``smallest_k``, ``largest_beta``: tens of δ) evaluates in all, well
under a second on one core; a solve that would need more is refused (``WorkLimit``): only
near the corner β ≈ BETA_MIN with ε near −ln(1−β). Counted the same whether a δ came from the
cache or not, so the answer never depends on what was asked before."""
DELTA_CACHE = 4096  # δ by its exact (k, β, ε, stopping): queues and solves ask again and again
Stopping = Literal["kl", "design"]
_NEAR = 1e-9  # γn within this (relative) of an integer: decided exactly (module docstring)
EPSILON_SLACK = 2.0**-51  # τ(β) = EPSILON_SLACK·(1 + ε_β): the boundary's tolerance (docstring)
_EXP_DIGITS = (40, 80, 160, 320, 640, 1280)


class WorkLimit(ValueError):
    """A computation past its bound (``MAX_SEARCH_N``, ``SOLVE_BUDGET_N``); the message names
    the inputs and the bound."""


@dataclass(frozen=True)
class KAnonDelta:
    """δ of Theorem 5 and how it was found."""

    beta: float
    k: int
    epsilon: float
    delta: float
    log_delta: float
    gamma: float
    n_m: int
    n_max: int  # the n where the maximum was reached
    n_searched: int  # the n where the Chernoff bound stopped the search

    @property
    def work(self) -> int:
        """How many n were evaluated."""
        return self.n_searched - self.n_m + 1


class _Exp:
    """e^ε bracketed by rationals, for exact comparisons a·e^ε against c (module docstring)."""

    def __init__(self, epsilon: float) -> None:
        self.epsilon = epsilon
        self._bounds: dict[int, tuple[Fraction, Fraction]] = {}

    def bounds(self, digits: int) -> tuple[Fraction, Fraction]:
        """lo ≤ e^ε ≤ hi: ``decimal``'s exp is correctly rounded to ``digits`` significant
        digits (half an ulp ≤ ½·10^(1−digits)·E), so E·(1 ± 10^(1−digits)) brackets e^ε."""
        if digits not in self._bounds:
            e = Fraction(Context(prec=digits).exp(Decimal(self.epsilon)))
            slack = e / 10 ** (digits - 1)
            self._bounds[digits] = (e - slack, e + slack)
        return self._bounds[digits]

    def sign(self, a: Fraction | int, c: Fraction | int) -> int:
        """The sign of a·e^ε − c for a ≥ 0; 0 only if a = c = 0 or (never seen) the bracket
        did not decide at 1280 digits: callers take 0 the way that over-states δ."""
        if a == 0:
            return (c < 0) - (c > 0)
        for digits in _EXP_DIGITS:
            lo, hi = self.bounds(digits)
            if a * lo > c:
                return 1
            if a * hi < c:
                return -1
        return 0  # pragma: no cover - a·e^ε = c needs e^ε rational


@lru_cache(maxsize=4096)
def covered_epsilon(*, beta: float) -> float:
    """The smallest double ≥ −ln(1−β), the smallest ε Theorem 5 covers: decided exactly,
    (1−β)·e^x ≥ 1, starting from −log1p(−β) (within an ulp or two)."""
    one_minus = 1 - Fraction(beta)

    def covers(x: float) -> bool:
        return _Exp(x).sign(one_minus, 1) > 0

    x = -math.log1p(-beta)
    while not covers(x):
        x = math.nextafter(x, math.inf)
    while covers(down := math.nextafter(x, 0.0)):
        x = down
    return x


def min_epsilon(*, beta: float) -> float:
    """The smallest ε accepted at β: ``covered_epsilon`` less the rounding slack τ(β) of a
    double evaluation of −ln(1−β) (module docstring). An accepted ε below ``covered_epsilon``
    is read as the boundary: see ``effective_epsilon``."""
    lo = covered_epsilon(beta=beta)
    return lo - EPSILON_SLACK * (1.0 + lo)


def effective_epsilon(*, beta: float, epsilon: float) -> float:
    """The ε the guarantee is computed and reported at: max(ε, covered_epsilon(β))."""
    return max(epsilon, covered_epsilon(beta=beta))


def gamma(*, beta: float, epsilon: float) -> float:
    """γ = (e^ε − 1 + β) / e^ε = 1 − (1−β)e^{−ε}, as a double (γn is decided exactly near
    integers: ``_tail_start``)."""
    return -math.expm1(math.log1p(-beta) - epsilon)


def check(*, beta: float | None = None, k: int | None = None, epsilon: float | None = None) -> None:
    """Raise ValueError naming the field and its limit."""
    if beta is not None and not (BETA_MIN <= beta <= BETA_MAX and math.isfinite(beta)):
        raise ValueError(f"beta must be in [{BETA_MIN}, {BETA_MAX}], got {beta=}")
    if k is not None and not (1 <= k <= K_MAX):
        raise ValueError(f"k must be an integer in [1, {K_MAX}], got {k=}")
    if epsilon is not None:
        if not (0 < epsilon <= EPSILON_MAX and math.isfinite(epsilon)):
            raise ValueError(f"epsilon must be in (0, {EPSILON_MAX}], got {epsilon=}")
        if beta is not None and epsilon < min_epsilon(beta=beta):
            raise ValueError(
                f"epsilon must be >= -ln(1-beta) = {covered_epsilon(beta=beta):.6g} for "
                f"beta={beta} (Li, Qardaji & Su, Thm 5), got {epsilon=}"
            )


def log_binom_tail(
    n: np.ndarray, m: np.ndarray, beta: float, *, below: float = -math.inf
) -> np.ndarray:
    """log P[Bin(n, β) ≥ m], elementwise, for m > nβ (the upper tail).

    scipy's survival function where it is above e^−600; below, the log-sum-exp of the first
    ``DEEP_TERMS`` log-pmf terms plus a geometric bound on the rest (past the mean, the term
    ratio t_{j+1}/t_j = (n−j)β / ((j+1)(1−β)) falls with j), so the value is an upper bound
    within a relative 1e-15 or so. Tails below e^``below`` (which cannot matter to the caller)
    are left at their underflowed value."""
    from scipy import stats  # 0.5 s of import every process that loads the queues would pay

    n = np.asarray(n, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    with np.errstate(divide="ignore"):
        out = np.asarray(stats.binom.logsf(m - 1, n, beta), dtype=np.float64)
    if below < DEEP:
        deep = np.flatnonzero(~(out > DEEP) & (m <= n))
        if deep.size:
            out[deep] = _log_deep_tail(n[deep], m[deep], beta)
    out[m > n] = -np.inf
    out[m <= 0] = 0.0
    return out


DEEP = -600.0
DEEP_TERMS = 64


def _log_deep_tail(n: np.ndarray, m: np.ndarray, beta: float) -> np.ndarray:
    lb, l1b = math.log(beta), math.log1p(-beta)
    j = m[:, None] + np.arange(DEEP_TERMS, dtype=np.float64)[None, :]
    valid = j <= n[:, None]
    jj = np.minimum(j, n[:, None])
    nn = n[:, None]
    terms = (
        special.gammaln(nn + 1)
        - special.gammaln(jj + 1)
        - special.gammaln(nn - jj + 1)
        + jj * lb
        + (nn - jj) * l1b
    )
    terms = np.where(valid, terms, -np.inf)
    head = special.logsumexp(terms, axis=1)
    # the rest: at most t_last · r/(1−r) with r the ratio after the last term summed
    last = m + DEEP_TERMS - 1
    r = (n - last) * beta / ((last + 1) * (1 - beta))
    more = (last < n) & (r < 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rest = np.where(more, terms[:, -1] + np.log(r) - np.log1p(-r), -np.inf)
    # a slowly falling tail (r ≥ 1 after DEEP_TERMS terms) cannot be this deep: bound by 1
    rest = np.where((last < n) & (r >= 1), 0.0, rest)
    return np.logaddexp(head, rest)


def _tail_start(g: float, n: np.ndarray, beta: float, exp: _Exp) -> np.ndarray:
    """The smallest integer j with j > γn, exactly: from the double γn where it is not near an
    integer, else by comparing (n−m)·e^ε with (1−β)n for the nearest integer m (module
    docstring); an undecided comparison (never seen) puts m in the tail."""
    gn = g * n
    start = np.floor(gn) + 1.0
    m = np.rint(gn)
    one_minus = 1 - Fraction(beta)
    for i in np.flatnonzero(np.abs(gn - m) <= _NEAR * np.maximum(gn, 1.0)).tolist():
        big_n, mi = int(n[i]), int(m[i])
        above = exp.sign(big_n - mi, big_n * one_minus) <= 0  # m > γn
        start[i] = mi if above else mi + 1
    return start


def _n_m(k: int, g: float, beta: float, exp: _Exp) -> int:
    """n_m = ⌈k/γ − 1⌉, exactly: the smallest N ≥ 1 with γ(N+1) ≥ k, i.e. with
    (N+1−k)·e^ε ≥ (1−β)(N+1) (a non-positive N+1−k never qualifies: γ < 1)."""
    one_minus = 1 - Fraction(beta)

    def reaches(big_n: int) -> bool:
        a = big_n + 1 - k
        return a > 0 and exp.sign(a, (big_n + 1) * one_minus) > 0

    n = max(math.ceil(k / g - 1), 1)
    while n > 1 and reaches(n - 1):
        n -= 1
    while not reaches(n):
        n += 1
    return n


def chernoff_rate(*, g: float, beta: float, rule: Stopping = "kl") -> float:
    """The exponent r of a Chernoff bound P[Bin(n, β) ≥ γn] ≤ exp(−n·r), for γ > β.

    ``design``: r = γ ln(γ/β) − (γ − β), the rule of ARX (and of the first design, hence the name).
    ``kl``: r = D(γ‖β) = γ ln(γ/β) + (1−γ) ln((1−γ)/(1−β)), the Chernoff–Hoeffding bound
    itself. Since ln x ≥ 1 − 1/x, (1−γ) ln((1−γ)/(1−β)) ≥ β − γ, so the ``kl`` exponent is
    at least the ``design`` one: its bound is tighter, equally valid, and stops the search at
    a smaller n with the same maximum. Near β → 1 the ``design`` bound needs hundreds of
    times more n (β = 0.99, ε = −ln(1−β): 5e-5 against 9.5e-3), so ``kl`` is the default."""
    base = g * math.log(g / beta)
    if rule == "design":
        return base - (g - beta)
    return base + ((1 - g) * math.log((1 - g) / (1 - beta)) if g < 1 else -math.log1p(-beta))


@lru_cache(maxsize=DELTA_CACHE)
def delta(*, k: int, beta: float, epsilon: float, stopping: Stopping = "kl") -> KAnonDelta:
    """δ(k, β, ε) of Theorem 5 (module docstring), at ``effective_epsilon`` (reported as the
    result's ``epsilon``). Cached by its exact arguments; at most ``MAX_SEARCH_N`` values of n
    are evaluated (``WorkLimit`` past it)."""
    check(beta=beta, k=k, epsilon=epsilon)
    epsilon = effective_epsilon(beta=beta, epsilon=epsilon)
    g = gamma(beta=beta, epsilon=epsilon)
    exp = _Exp(epsilon)
    n_m = _n_m(k, g, beta, exp)
    # P[X > γn] ≤ exp(−n·rate), decreasing in n: γ > β whenever ε > 0.
    rate = chernoff_rate(g=g, beta=beta, rule=stopping)
    best, n_best = -math.inf, n_m
    lo = n_m
    stop = n_m + MAX_SEARCH_N - 1
    size = 64
    while lo <= stop:
        n = np.arange(lo, min(lo + size, stop + 1), dtype=np.float64)
        logs = log_binom_tail(n, _tail_start(g, n, beta, exp), beta, below=best)
        i = int(np.argmax(logs))
        if logs[i] > best:
            best, n_best = float(logs[i]), int(n[i])
        if best > -math.inf and rate > 0:
            # the first n whose bound is below the best tail: nothing past it can beat it
            stop = min(stop, math.floor(-best / rate) + 1)
        lo = int(n[-1]) + 1
        size = min(size * 2, CHUNK * 16)
    if lo <= stop:  # pragma: no cover - the input bounds keep the search far below this
        raise WorkLimit(
            f"beta, k, epsilon: delta at beta={beta}, k={k}, epsilon={epsilon} needs more "
            f"than the bound of {MAX_SEARCH_N} evaluations"
        )
    return KAnonDelta(
        beta=beta,
        k=k,
        epsilon=epsilon,
        delta=math.exp(best),
        log_delta=best,
        gamma=g,
        n_m=n_m,
        n_max=n_best,
        n_searched=lo - 1,
    )


class _Work:
    """The n a solve has evaluated, against ``SOLVE_BUDGET_N``."""

    def __init__(self, solving: str) -> None:
        self.solving = solving
        self.n = 0

    def add(self, r: KAnonDelta) -> KAnonDelta:
        self.n += r.work
        if self.n > SOLVE_BUDGET_N:
            raise WorkLimit(
                f"{self.solving} needs more than the calculator's bound of {SOLVE_BUDGET_N} "
                "evaluations (under a second): the search is long where beta is small and "
                "epsilon near -ln(1-beta); a larger epsilon needs less"
            )
        return r


def _check_target(target: float) -> float:
    if not (0 < target < 1):
        raise ValueError(f"delta must be in (1e-300, 1), got delta={target}")
    log_t = math.log(target)
    if log_t < LOG_DELTA_MIN:
        raise ValueError(f"delta must be in (1e-300, 1), got delta={target}")
    return log_t


def smallest_k(*, beta: float, epsilon: float, target_delta: float) -> KAnonDelta:
    """The smallest k with δ(k, β, ε) ≤ target (δ is non-increasing in k: bisection)."""
    log_t = _check_target(target_delta)
    check(beta=beta, epsilon=epsilon)
    work = _Work(f"k, delta: solving for k at beta={beta}, epsilon={epsilon}, delta={target_delta}")

    def ok(k: int) -> bool:
        return work.add(delta(k=k, beta=beta, epsilon=epsilon)).log_delta <= log_t

    hi = 1
    while not ok(hi):
        if hi >= K_MAX:
            raise ValueError(
                f"delta={target_delta} is not reachable with k <= {K_MAX} at beta={beta}, "
                f"epsilon={epsilon}"
            )
        hi = min(hi * 2, K_MAX)
    lo = hi // 2  # not ok (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return delta(k=hi, beta=beta, epsilon=epsilon)


def largest_beta(
    *, k: int, epsilon: float, target_delta: float, tolerance: float = 1e-9
) -> KAnonDelta:
    """A largest β (to ``tolerance``) that meets the target: with ε ≥ −ln(1−β),
    δ(k, β, ε) ≤ target at the returned β and δ > target just above it (unless it is the cap
    min(β_max, 1 − e^{−ε})). Whatever this search finds, the returned β itself meets the
    target by the theorem, which is what a queue configured with it relies on.

    δ is *not* monotone in β: for a fixed n the tail grows with β, but where γn crosses an
    integer the tail drops (e.g. k = 1, ε = 0.5: δ falls from 0.32 at β = 0.1751 to 0.18 at
    β = 0.1761), so {β : δ ≤ target} can be a union of intervals. The search scans a grid of
    ``GRID`` points up to the first that misses the target and bisects between it and the
    point before; a narrow spike between two grid points below the answer can go unseen (it
    does not matter for the answer's guarantee)."""
    log_t = _check_target(target_delta)
    check(k=k, epsilon=epsilon)
    cap = min(BETA_MAX, -math.expm1(-epsilon))  # ε ≥ −ln(1−β)  ⇔  β ≤ 1 − e^{−ε}
    if cap < BETA_MIN:
        raise ValueError(
            f"epsilon={epsilon} is below -ln(1-beta) for every beta >= {BETA_MIN}; "
            f"it must be at least {covered_epsilon(beta=BETA_MIN):.3g}"
        )
    # 1 − e^{−ε} in floating point may sit a rounding error above the exact bound: the cap is
    # the largest double β with (1−β)·e^ε ≥ 1, so ε itself is covered there (no slack used)
    exp = _Exp(epsilon)
    while cap > BETA_MIN and exp.sign(1 - Fraction(cap), 1) <= 0:
        cap = math.nextafter(cap, 0.0)

    work = _Work(f"beta, delta: solving for beta at k={k}, epsilon={epsilon}, delta={target_delta}")

    def at(b: float) -> KAnonDelta:
        return work.add(delta(k=k, beta=b, epsilon=epsilon))

    grid = np.linspace(BETA_MIN, cap, GRID).tolist()
    lo = None
    for b in grid:
        if at(b).log_delta > log_t:
            hi = b
            break
        lo = b
    else:
        return at(cap)
    if lo is None:
        raise ValueError(
            f"delta={target_delta} is not reachable at k={k}, epsilon={epsilon} "
            f"even with beta={BETA_MIN}"
        )
    while hi - lo > tolerance * max(lo, 1e-3):
        mid = (lo + hi) / 2
        if at(mid).log_delta <= log_t:
            lo = mid
        else:
            hi = mid
    return at(lo)
