"""Differential privacy of β-sampling followed by k-anonymisation (DESIGN §11, §2.5).

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
every larger n has a smaller tail, so the maximum is known. DESIGN §11 (and ARX's
``EDDifferentialPrivacy``) use the bound ``exp(−n(γ ln(γ/β) − (γ − β)))``; by default we
use the relative-entropy form of the same Chernoff bound, which is never looser and ends the
search much sooner for β near 1 (``chernoff_rate``); both give the same δ (tested).
Everything is computed in log space: the tail by scipy's binomial survival function (boost's
incomplete beta, accurate in relative terms) and, where that underflows, by log-sum-exp of the
log pmf, so tiny δ are exact too and the stopping rule never waits for a tail of 0.

δ decreases (weakly) in k and in ε. The inverses are searches: the smallest integer k that
reaches a target δ at (β, ε) (δ is monotone in k, so bisection is exact) and the largest β
(δ is not monotone in β: see ``largest_beta``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import special, stats

BETA_MIN = 1e-3
BETA_MAX = 0.99
K_MAX = 1_000_000
EPSILON_MAX = 50.0
LOG_DELTA_MIN = math.log(1e-300)  # targets below this are refused
CHUNK = 4096
GRID = 33  # β grid of largest_beta
N_SEARCH_SPAN = 50_000_000  # n past n_m; far above what the bounded inputs need (tested)
Stopping = Literal["kl", "design"]
_TIE = 1e-9  # γn within this (relative) of an integer counts as that integer: δ never under-stated


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


def min_epsilon(*, beta: float) -> float:
    """The smallest ε Theorem 5 covers: ε ≥ −ln(1−β)."""
    return -math.log1p(-beta)


def gamma(*, beta: float, epsilon: float) -> float:
    """γ = (e^ε − 1 + β) / e^ε = 1 − (1−β)e^{−ε}."""
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
                f"epsilon must be >= -ln(1-beta) = {min_epsilon(beta=beta):.6g} for "
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


def _tail_start(g: float, n: np.ndarray) -> np.ndarray:
    """The smallest j with j > γn (ties within rounding count as in the tail)."""
    gn = g * n
    return np.floor(gn - _TIE * np.maximum(gn, 1.0)) + 1.0


def chernoff_rate(*, g: float, beta: float, rule: Stopping = "kl") -> float:
    """The exponent r of a Chernoff bound P[Bin(n, β) ≥ γn] ≤ exp(−n·r), for γ > β.

    ``design``: r = γ ln(γ/β) − (γ − β), the rule of DESIGN §11 and ARX.
    ``kl``: r = D(γ‖β) = γ ln(γ/β) + (1−γ) ln((1−γ)/(1−β)), the Chernoff–Hoeffding bound
    itself. Since ln x ≥ 1 − 1/x, (1−γ) ln((1−γ)/(1−β)) ≥ β − γ, so the ``kl`` exponent is
    at least the ``design`` one: its bound is tighter, equally valid, and stops the search at
    a smaller n with the same maximum. Near β → 1 the ``design`` bound needs hundreds of
    times more n (β = 0.99, ε = −ln(1−β): 5e-5 against 9.5e-3), so ``kl`` is the default."""
    base = g * math.log(g / beta)
    if rule == "design":
        return base - (g - beta)
    return base + ((1 - g) * math.log((1 - g) / (1 - beta)) if g < 1 else -math.log1p(-beta))


def delta(*, k: int, beta: float, epsilon: float, stopping: Stopping = "kl") -> KAnonDelta:
    """δ(k, β, ε) of Theorem 5 (module docstring)."""
    check(beta=beta, k=k, epsilon=epsilon)
    g = gamma(beta=beta, epsilon=epsilon)
    n_m = max(math.ceil(k / g - 1 - _TIE), 1)
    # P[X > γn] ≤ exp(−n·rate), decreasing in n: γ > β whenever ε > 0.
    rate = chernoff_rate(g=g, beta=beta, rule=stopping)
    best, n_best = -math.inf, n_m
    lo = n_m
    stop = n_m + N_SEARCH_SPAN
    size = 64
    while lo <= stop:
        n = np.arange(lo, min(lo + size, stop + 1), dtype=np.float64)
        logs = log_binom_tail(n, _tail_start(g, n), beta, below=best)
        i = int(np.argmax(logs))
        if logs[i] > best:
            best, n_best = float(logs[i]), int(n[i])
        if best > -math.inf and rate > 0:
            # the first n whose bound is below the best tail: nothing past it can beat it
            stop = min(stop, math.floor(-best / rate) + 1)
        lo = int(n[-1]) + 1
        size = min(size * 2, CHUNK * 16)
    if lo <= stop:  # pragma: no cover - the input bounds keep the search far below this
        raise ValueError("the search for the maximum did not end; inputs out of range")
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

    def ok(k: int) -> bool:
        return delta(k=k, beta=beta, epsilon=epsilon).log_delta <= log_t

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
            f"it must be at least {min_epsilon(beta=BETA_MIN):.3g}"
        )
    # 1 − e^{−ε} in floating point may sit a rounding error above the exact bound
    while cap > BETA_MIN and epsilon < min_epsilon(beta=cap):
        cap = math.nextafter(cap, 0.0)

    def at(b: float) -> KAnonDelta:
        return delta(k=k, beta=b, epsilon=epsilon)

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
