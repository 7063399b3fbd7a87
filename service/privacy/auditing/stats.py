"""The audit's statistics: a Clopper–Pearson lower bound on ε from two samples of a test
statistic (the package docstring states the procedure and what it proves)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.stats import beta as beta_dist

FloatArray = NDArray[np.float64]
MAX_THRESHOLDS = 256
"""Candidate thresholds tried on the selection half (quantiles of its pooled statistics)."""


def cp_lower(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson lower bound: ``P[p < bound] <= alpha`` for ``k`` successes in
    ``n`` Bernoulli(p) trials (Clopper & Pearson 1934): the ``alpha`` quantile of
    Beta(k, n − k + 1), 0 for ``k = 0``."""
    _check(k, n, alpha)
    return 0.0 if k == 0 else float(beta_dist.ppf(alpha, k, n - k + 1))


def cp_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson upper bound: ``P[p > bound] <= alpha``: the ``1 − alpha``
    quantile of Beta(k + 1, n − k), 1 for ``k = n``."""
    _check(k, n, alpha)
    return 1.0 if k == n else float(beta_dist.ppf(1.0 - alpha, k + 1, n - k))


def _check(k: int, n: int, alpha: float) -> None:
    if not (n >= 1 and 0 <= k <= n):
        raise ValueError(f"need 0 <= k <= n and n >= 1, got {k=} {n=}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha=}")


def epsilon_bound(
    *, hits_1: int, hits_0: int, n_1: int, n_0: int, delta: float, alpha: float
) -> float:
    """``max(0, ln((p1_lo − δ) / p0_hi))`` with ``p1_lo`` the CP lower bound of the rejection
    rate under the favoured input and ``p0_hi`` the CP upper bound under the other, each at
    ``alpha/2`` (so both hold together with probability ``>= 1 − alpha``)."""
    p1 = cp_lower(hits_1, n_1, alpha / 2)
    p0 = cp_upper(hits_0, n_0, alpha / 2)
    if p1 <= delta:
        return 0.0
    return max(0.0, math.log((p1 - delta) / p0))


@dataclass(frozen=True)
class Rejection:
    """The rejection set ``{s >= threshold}`` (``upper``) or ``{s <= threshold}``, and the
    input it favours (``favours_one``: input 1 is likelier to land in it)."""

    upper: bool
    threshold: float
    favours_one: bool = True

    def hits(self, s: FloatArray) -> int:
        return int(np.count_nonzero(s >= self.threshold if self.upper else s <= self.threshold))


@dataclass(frozen=True)
class Bound:
    """An audited lower bound: ``epsilon`` holds with probability ``>= confidence`` (whatever
    the mechanism) when the mechanism is (ε, ``delta``)-DP only for ε >= ``epsilon``."""

    epsilon: float
    confidence: float
    delta: float
    rejection: Rejection
    hits_favoured: int
    hits_other: int
    n_test: int


def _counts_at_least(sorted_s: FloatArray, thresholds: FloatArray) -> NDArray[np.int64]:
    return (sorted_s.size - np.searchsorted(sorted_s, thresholds, side="left")).astype(np.int64)


def _counts_at_most(sorted_s: FloatArray, thresholds: FloatArray) -> NDArray[np.int64]:
    return np.searchsorted(sorted_s, thresholds, side="right").astype(np.int64)


def choose_rejection(s0: FloatArray, s1: FloatArray, *, delta: float, alpha: float) -> Rejection:
    """The rejection set with the largest :func:`epsilon_bound` on these samples, among
    ``{s >= t}`` and ``{s <= t}`` for up to ``MAX_THRESHOLDS`` thresholds ``t`` (quantiles of
    the pooled values). Run on the selection half only."""
    pooled = np.unique(np.concatenate([s0, s1]))
    if pooled.size > MAX_THRESHOLDS:
        pooled = np.unique(
            np.quantile(pooled, np.linspace(0.0, 1.0, MAX_THRESHOLDS), method="nearest")
        )
    a0, a1 = np.sort(s0), np.sort(s1)
    best = Rejection(True, float(pooled[-1]))
    best_eps = -1.0
    for upper, favours_one in ((True, True), (True, False), (False, True), (False, False)):
        count = _counts_at_least if upper else _counts_at_most
        fav, other = (a1, a0) if favours_one else (a0, a1)
        hf, ho = count(fav, pooled), count(other, pooled)
        # cheap screen first (point estimates), then CP on the most promising thresholds
        with np.errstate(divide="ignore", invalid="ignore"):
            point = np.log(np.maximum(hf / fav.size - delta, 0.0) / ((ho + 1) / other.size))
        order = np.argsort(-np.nan_to_num(point, nan=-np.inf, neginf=-np.inf))[:32]
        for i in order.tolist():
            eps = epsilon_bound(
                hits_1=int(hf[i]),
                hits_0=int(ho[i]),
                n_1=fav.size,
                n_0=other.size,
                delta=delta,
                alpha=alpha,
            )
            if eps > best_eps:
                best, best_eps = Rejection(upper, float(pooled[i]), favours_one), eps
    return best


def lower_bound(s0: FloatArray, s1: FloatArray, *, delta: float, confidence: float) -> Bound:
    """The audited lower bound on ε from statistics ``s0`` (releases on input 0) and ``s1``
    (on input 1), iid each: the first half of each chooses the rejection set, the second half,
    independent of that choice, bounds its two rates (package docstring)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence=}")
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta=}")
    n = min(s0.size, s1.size)
    if n < 4:
        raise ValueError(f"need at least 4 releases on each input, got {n}")
    half = n // 2
    alpha = 1.0 - confidence
    rej = choose_rejection(s0[:half], s1[:half], delta=delta, alpha=alpha)
    t0, t1 = s0[half:n], s1[half:n]
    fav, other = (t1, t0) if rej.favours_one else (t0, t1)
    hf, ho = rej.hits(fav), rej.hits(other)
    eps = epsilon_bound(
        hits_1=hf, hits_0=ho, n_1=fav.size, n_0=other.size, delta=delta, alpha=alpha
    )
    return Bound(eps, confidence, delta, rej, hf, ho, int(fav.size))
