"""Empirical-Bayes smoothed log-odds (``featurize.shrinkage = "empirical_bayes"``): each key's
noisy counts turned into log-odds shrunk toward the prior's by how much the key's own counts
can be trusted, given its noisy total and the known noise variance.

Model (per table, per label ``l`` ≥ 1, that label against the rest; normal-normal empirical
Bayes on the logit scale, as in Efron & Morris, "Data analysis using Stein's estimator and its
generalizations", JASA 1975, and the random-effects model of DerSimonian & Laird,
"Meta-analysis in clinical trials", Controlled Clinical Trials 1986; no paper of this product
covers it):

* the observation: a key's estimates ĉ_m (the count-median sketch's median over ``depth`` rows
  of the count period's summed cells, clamped at 0), its noisy total n̂ = Σ_m ĉ_m, and
  a = ĉ_l + π_l, b = n̂ − ĉ_l + (1 − π_l), where π is the label prior
  (``columns.prior_probabilities``): one prior pseudo-observation split as the prior, so that
  n̂ = 0 gives exactly the prior's log-odds (the usual ½ + ½ correction is this for π_l = ½);
* its log-odds ℓ̂ = log a − log b, and their variance by the delta method with the counts'
  variance Var(ĉ_l) = c_l (Poisson sampling) + σ² (noise), Var(rest) = c_rest + (L − 1)σ²:

      v = (a + σ²)/a² + (b + (L − 1)σ²)/b²

  (for two labels: 1/a + 1/b + σ²/a² + σ²/b²);
* σ² is the variance of one label's estimate of a key: ``Noise.variance_for(weight)`` (one
  window's cell, ``service.core.dp.budget``) × the windows summed in the count period (the
  back-off threshold's σ², ``columns.backoff_threshold``) × the variance of the median of
  ``depth`` independent draws relative to one draw (``MEDIAN_VARIANCE``: normal draws, the sum
  of the count period's windows' noise being close to normal; even depths average the two
  middle rows, as the estimator does). Hash collisions add variance not counted here;
* the prior on a key's true log-odds: ℓ ~ N(ℓ_prior, τ²), ℓ_prior = logit(π_l);
* the posterior mean, the column:

      shrunk = ℓ_prior + τ²/(τ² + v) · (ℓ̂ − ℓ_prior)

  and ``<t>:p:<l>`` its logistic function (one label against the rest: with more than two
  labels the p's need not sum to 1).

Properties (tests in ``tests/core/test_shrinkage.py``): n̂ → 0 gives ℓ_prior exactly (ℓ̂ is
ℓ_prior there); at a fixed label share, |shrunk − ℓ_prior| grows with the total (ℓ̂ moves away
from ℓ_prior and v falls); with σ = 0 and a growing total, shrunk → ℓ̂ → logit of the share.
No back-off: a key below the back-off threshold keeps its (heavily) shrunk values, the
``<t>:backoff`` column still flags it.

τ² (per table and label; ``featurize.eb_variance`` sets it for all instead) is estimated from
the table's own noisy cells when the featurizer is built (once per epoch): every cell
(row, bucket) of the count period's summed table is read as one key's observation, oriented by
the sign of its total (a count-sketch row adds a key's counts with a ±1 sign), kept when its
total is at least ``MIN_SIGMAS`` standard deviations of a cell's noise over all labels and at
least 1 (a cell of noise alone passes with probability ~4·10⁻⁵ at worst, one window's two
Laplace draws; 4 σ let 13 of 49,152 noise cells through on MovieLens at ε = 1, twice the 6
real cells of its two-valued gender table), and when no label's count is
below −``NEGATIVE_SIGMAS`` σ (a collision of keys of opposite signs, whose difference is no
key's); then, the kept cells' deviations d = ℓ̂ − ℓ_prior being d ~ N(0, v + τ²), τ² is the
value at which the median of d²/(v + τ²) is χ²₁'s median, 0.4549 (by bisection; 0 when the
median is below it at τ² = 0 or no cell is kept): a median rather than the likelihood, so that
a minority of kept cells of noise alone (heavy-tailed: summed Laplace draws) or of colliding
keys cannot set τ². The threshold matters more: for a table of a few values the noise cells
must stay fewer than the real ones (on MovieLens at ε = 1, four windows, the gender table's 6
real cells: from 4 σ, 13 noise cells passed and τ² came out 0.19-0.32 under noise against 0.02
without; from 6 σ 0.021-0.023 under noise). Collisions of keys of the same sign average their
log-odds and bias τ² low: more shrinkage.

Privacy: everything here is a function of the noisy tables (the aggregate's cells, the prior
table) and of public settings; post-processing of ε-DP (ρ-zCDP) releases, no privacy cost, and
nothing of the hot rows. Vectorised numpy over keys (and cells): no per-row Python.
"""

from __future__ import annotations

import numpy as np

# Var(median of d iid N(0,1)) for d = 1 … 16 (numpy's median: the mean of the two middle
# draws for even d), by quadrature of the order statistics' densities; tests check them.
MEDIAN_VARIANCE = (
    1.0,
    0.5,
    0.4487,
    0.2982,
    0.2868,
    0.2147,
    0.2104,
    0.1682,
    0.1661,
    0.1383,
    0.1372,
    0.1175,
    0.1168,
    0.1022,
    0.1017,
    0.0904,
)
MIN_SIGMAS = 6.0
NEGATIVE_SIGMAS = 3.0
BISECTION_STEPS = 60
CHI2_1_MEDIAN = 0.454936423119572  # the median of χ² with one degree of freedom


def estimate_variance(*, noise_variance: float, n_windows: int, depth: int) -> float:
    """σ²: the noise variance of one label's estimate of a key over the count period (a cell's
    per window × windows summed × the median's factor)."""
    return max(noise_variance, 0.0) * max(n_windows, 0) * MEDIAN_VARIANCE[depth - 1]


def log_odds(
    counts: np.ndarray, prior: np.ndarray, sigma2: float | np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per key (rows of ``counts``, clamped at 0, shape (n, L)) and label: ℓ̂, its variance v
    (both (n, L)) and ℓ_prior (L,), each label against the rest. ``sigma2``: one, or one per
    key."""
    n_labels = counts.shape[1]
    prior = np.asarray(prior, dtype=np.float64)
    total = counts.sum(axis=1, keepdims=True)
    a = counts + prior[None, :]
    b = (total - counts) + (1.0 - prior)[None, :]
    s2 = np.asarray(sigma2, dtype=np.float64)
    s2 = s2[:, None] if s2.ndim else s2
    ell = np.log(a) - np.log(b)
    v = (a + s2) / (a * a) + (b + (n_labels - 1) * s2) / (b * b)
    ell_prior = np.log(prior) - np.log1p(-prior)
    return ell, v, ell_prior


def shrink(
    estimates: np.ndarray,
    *,
    prior: np.ndarray,
    sigma2: float | np.ndarray,
    tau2: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(p, shrunk log-odds), both (n, L), of estimates ĉ (n, L). ``tau2``: τ² per label (L,),
    or per key and label (n, L); ``sigma2``: one, or one per key."""
    counts = np.maximum(estimates, 0.0)
    ell, v, ell_prior = log_odds(counts, prior, sigma2)
    t = np.asarray(tau2, dtype=np.float64)
    t = t[None, :] if t.ndim == 1 else t
    weight = t / (t + v)
    shrunk = ell_prior[None, :] + weight * (ell - ell_prior[None, :])
    p = 1.0 / (1.0 + np.exp(-shrunk))
    return p, shrunk


def between_variance(table: np.ndarray, *, prior: np.ndarray, cell_variance: float) -> np.ndarray:
    """τ² per label (L,; label 0's too, one against the rest) from a table's summed cells,
    ``table`` of shape (L, depth, width) (``[label][row][bucket]``). ``cell_variance``: one
    cell's noise variance over the count period (the σ² of v here: a cell is one row's, no
    median)."""
    n_labels = table.shape[0]
    x = table.reshape(n_labels, -1).T.astype(np.float64)  # (cells, L)
    total = x.sum(axis=1)
    x *= np.where(total < 0, -1.0, 1.0)[:, None]
    total = np.abs(total)
    sd = np.sqrt(max(cell_variance, 0.0))
    keep = (total >= max(MIN_SIGMAS * sd * np.sqrt(n_labels), 1.0)) & (
        x.min(axis=1) >= -NEGATIVE_SIGMAS * sd
    )
    if not keep.any():
        return np.zeros(n_labels)
    ell, v, ell_prior = log_odds(np.maximum(x[keep], 0.0), prior, cell_variance)
    d2 = (ell - ell_prior[None, :]) ** 2
    return np.array([_robust_variance(d2[:, m], v[:, m]) for m in range(n_labels)])


def _robust_variance(d2: np.ndarray, v: np.ndarray) -> float:
    """The T ≥ 0 at which the median of d²/(v + T) is the median of χ²₁ (d ~ N(0, v + T)
    makes d²/(v + T) a χ²₁ draw), by bisection (the median falls as T grows); 0 when the
    median is at most that already at T = 0."""

    def median(t: float) -> float:
        return float(np.median(d2 / (v + t)))

    if median(0.0) <= CHI2_1_MEDIAN:
        return 0.0
    lo, hi = 0.0, 2.0 * float(d2.max()) / CHI2_1_MEDIAN + 1.0  # at hi every ratio is below
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if median(mid) > CHI2_1_MEDIAN:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
