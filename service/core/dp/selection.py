"""Differentially private count-table selection (docs/ARCHITECTURE.md, "Count-table selection"):
pure numpy, no I/O.

On each roll a worker scores candidate feature groups on the hot-period data and picks up to
``groups_per_round`` of them with the exponential mechanism; the picked groups get count tables
from the window after next on (the next one may be prepared already: ``service.selection``).

Scores
------
``Î(X; Y)`` is the empirical (plug-in) mutual information, in NATS, of the contingency table of
``n`` records with joint counts ``c_xy``, margins ``a_x``, ``b_y``:

    Î = Σ_{x,y: c_xy>0} (c_xy/n) · log(n·c_xy / (a_x·b_y)),      0 <= Î <= log min(L, n),

L the number of labels.  A candidate group ``G`` extends an existing table ``t`` by one feature
(``G = t ∪ {f}``, ``f ∉ t``; groups are sorted tuples; a group that already has a table is not a
candidate).  Its score is the marginal gain over the most informative existing table it refines:

    gain(G) = Î(G; Y) − max_{t ∈ bases(G)} Î(t; Y) = min_t [Î(G; Y) − Î(t; Y)],

bases(G) = every existing table whose features are a proper subset of ``G``'s (the single
features always among them), not only ``G`` minus one feature: ``age+occupation+user_id``
refines the ``user_id`` table, which already holds everything it holds, so it gains 0 (with
one-feature bases only it was scored against ``age+occupation`` and picked, BENCHMARKS.md,
selection).  Each bracket is in ``[0, log min(L, n)]`` (``G``'s cells refine ``t``'s: data
processing), and so is the minimum.  The bounds below use only that ``G`` refines ``t``.

Sensitivity of empirical MI (derived here; add/remove-one neighbours)
-------------------------------------------------------------------------
Let ``φ(m) = (m+1)·log(m+1) − m·log(m)`` (``φ(0) = 0``): increasing, concave, and
``φ(m)/(m+1) = h(1/(m+1))``, the binary entropy in nats.  Concavity with ``φ(0) = 0`` gives
``φ(p+q) − φ(p) <= φ(q)``, increments over a window of fixed length shrink as it moves right,
and for integers ``p+q <= m``: ``φ(p) + φ(q) − φ(m) <= B(m) := φ(⌊m/2⌋) + φ(⌈m/2⌉) − φ(m)``.

Write ``S = n·H = n·log n − Σ_cells c·log c`` for a count vector.  Adding one record to a cell
holding ``c`` of ``m`` records changes ``S`` by ``φ(m) − φ(c)``.  Let ``D`` have ``m`` records
and ``D' = D + (x, y)``, with counts in ``D``: ``a = #x``, ``b = #y``, ``c = #(x, y)``.  Since
``m·Î = S_X + S_Y − S_XY``,

    (m+1)·Î(D') − m·Î(D) = Δ := φ(m) − φ(a) − φ(b) + φ(c),
    Î(D') − Î(D) = (Δ − Î(D)) / (m+1).

* ``Δ <= φ(m)`` (``c <= a`` so ``φ(a) >= φ(c)``; ``φ(b) >= 0``), and ``Î(D) >= 0``:
  ``Î(D') − Î(D) <= φ(m)/(m+1)``.
* ``−Δ = [φ(a) − φ(c)] + φ(b) − φ(m) <= φ(a−c) + φ(b) − φ(m) <= B(m)`` since the ``a−c``
  records with ``x`` but not ``y`` and the ``b`` with ``y`` are disjoint (``a−c+b <= m``); and
  ``Î(D) <= H(Y_D) <= log min(L, m)``: ``Î(D) − Î(D') <= (B(m) + log min(L, m))/(m+1)``.

Hence for every such pair (``D`` of ``m`` records, ``D'`` of ``m+1``)

    |Î(D') − Î(D)| <= g(m) := max(φ(m), B(m) + log min(L, m)) / (m+1),    g(0) = 0,

whatever the feature alphabet.  The first term is ATTAINED: ``m`` records ``(x0, y0)`` plus one
``(x1, y1)`` move Î from 0 to ``h(1/(m+1))``; for ``L <= 3`` it is the larger term for every m,
so ``g`` is then exactly the worst case (the brute-force test finds ratio bound / worst case =
1).  For L >= 4 the second term takes over from m = 4 on and is loose by at most
``(log L − log 4 + O(1/m))/(m+1)``.  Asymptotically ``g(m) ≈ (log m + 1)/m`` for small L,
half the ``(2/n)·log n`` bound usually quoted for information gain.  A dataset of ``n`` records
has neighbours of ``n − 1`` and ``n + 1`` records, so :func:`mi_sensitivity` is
``max(g(n−1), g(n))``; it is non-increasing in ``n >= 1`` (tested), so a public LOWER BOUND on
the record count may be passed instead of the count itself.

Gain: with base cells ``x2`` refined into ``x1`` and counts in ``D`` of ``a2 = #x2``,
``a1 = #x1``, ``c2 = #(x2, y)``, ``c1 = #(x1, y)``, the ``φ(m)`` and ``φ(b)`` terms cancel:

    (m+1)·gain(D') − m·gain(D) = Δ_g := [φ(a2) − φ(a1)] − [φ(c2) − φ(c1)],

with ``c1 <= c2``, ``c1 <= a1 <= a2 <= m`` and ``d := c2 − c1 <= a2 − a1``.  Then
``Δ_g <= φ(a2 − a1) <= φ(m)``, and ``−Δ_g <= φ(d) − [φ(m) − φ(m − d)] <= B(m)``, while
``0 <= gain(D) <= log min(L, m)``: exactly the two cases above, so the gain obeys the SAME bound
``g(m)`` (no factor 2 for a difference of two MIs), also attained (``m`` records
``(x2, f0, y0)`` plus ``(x2, f1, y1)``).  A minimum over bases keeps the bound
(``|min u − min u'| <= max |u − u'|``), and so does clipping at 0.

Penalised score ``"aic"`` (issue 18; the default): a gain that does not reward near-unique groups
------------------------------------------------------------------------------------------------------
The plug-in gain is biased upwards by about ``(L−1)(K_G − K_t)/(2n)`` (Miller 1955; Panzeri &
Treves 1996), ``K`` the number of occupied cells, and far more when cells hold one or two
records: a group unique per record has ``Î(G; Y) = H(Y)`` whatever the truth, so on MovieLens
``movie_id+user_id`` scored highest with no use to a model (BENCHMARKS.md, selection).  The
Miller–Madow correction does not help there (its term ``K_GY − K_G`` is 0 when every cell holds
one record).  We penalise instead by Akaike's criterion (Akaike 1974): ``n·gain_t`` is the
log-likelihood ratio (nats) of the model ``P(Y | G)`` against ``P(Y | t)``, which has
``(L−1)(K_G − K_t)`` more free parameters, so AIC prefers ``G`` iff
``n·gain_t > (L−1)(K_G − K_t)``.  The score is the per-record margin,

    aic(G) = min_{t ∈ bases(G)} [Î(G; Y) − Î(t; Y) − λ·(K_G − K_t)/n],    λ = L − 1,

not clipped (a negative score is a group AIC rejects: the round's public "pick nothing" outcome,
below, is then likely to win), 0 for ``n = 0``.  A near-unique group has
``K_G ≈ n`` and scores ``≈ H(Y|t) − (L−1) < 0`` for ``L = 2``; a group an existing table
determines (``K_G = K_t``, ``Î(G; Y) = Î(t; Y)``) scores exactly 0.

Sensitivity.  ``D`` of ``m >= 1`` records, ``D' = D + r``.  Write ``P = λ·ΔK/m``,
``ΔK = K_G − K_t`` with ``0 <= ΔK <= m − 1`` (``G`` refines ``t``, ``K_G <= m``, ``K_t >= 1``).
The record ``r`` opens a new cell of ``t`` only in a new cell of ``G``, so ``ΔK`` grows by
``δ ∈ {0, 1}``, and ``P(D') − P(D) = λ·(δ·m − ΔK)/(m(m+1))``, in ``[−λ(m−1)/(m(m+1)),
λ/(m+1)]``; for ``m = 0`` both are 0.  Hence ``|P(D') − P(D)| <= λ/(m+1)`` and by the triangle
inequality with the gain's ``g(m)`` (above), for a dataset of ``n`` records (pairs ``n−1 → n``
and ``n → n+1``):

    Δ_aic(n) = max(g(n−1), g(n)) + (L−1)/n,

non-increasing in ``n``; the minimum over bases keeps it.  The triangle inequality is not tight
(the record that moves the gain most opens a cell of ``G``, which raises ``P`` against it);
the brute-force test over all datasets of up to 7 records finds bound / worst case of 1.8–3.4
for ``L = 2`` (the worst case there stays below ``g`` itself) and 1.7–2.7 for ``L = 3``
(``tests/core/test_selection_score.py``); a tighter joint bound is left open.  At
``n = 10⁵``, ``L = 2`` the term adds 8 % to ``g``.  The placeholders below
form one cell in ``G`` and in ``t`` alike, so ``ΔK`` is the hot period's and on ``D*``:
``aic_{D*} = (n·gain − λ·ΔK)/(n+N) = n/(n+N) · aic_D``, the same factor as the gain's.

Public calibration: ``min_records`` placeholder records (issue 12, item 6)
------------------------------------------------------------------------
The bound ``g`` depends on the record count, and the hot period's count ``n`` is not public
(one record more moves it): a scale computed from ``n`` would leak part of ε every round, and so
would skipping rounds on ``n``.  A round therefore scores ``D* = D ∪ P``, the hot period ``D``
plus ``N = min_records`` placeholder records ``P`` that are public and fixed, each holding in
every feature a value ``⊥`` no real record has (any labels):

* ``D*`` has ``n* = n + N >= N`` records, and neighbours of ``D`` (one real record added or
  removed) give neighbours of ``D*``; every score on ``D*`` therefore moves by at most
  ``mi_sensitivity(n*) <= mi_sensitivity(N)`` (non-increasing, tested) whatever ``n``, ``0``
  included.  The Gumbel scale ``2k·gain_sensitivity(N)/ε`` is fixed by configuration and the
  round is ε-DP at every hot-period size: nothing about ``n`` is used but the data itself.
* ``P`` need not be built.  By the chain rule of the plug-in MI,
  ``Î(t ∪ {f}; Y) − Î(t; Y) = Σ_τ (n*_τ/n*) · Î(f; Y | t = τ)`` over the cells ``τ`` of ``t``.
  The placeholders' cell ``(⊥, …, ⊥)`` holds them alone, with ``f = ⊥`` throughout: it adds 0.
  Every other cell holds real records only, weighted ``n_τ/n* = (n/n*)·(n_τ/n)``.  Hence
  ``gain_{D*} = n/(n+N) · gain_D`` for every base, and the minimum over bases and the clip at 0
  commute with that positive factor:  ``score(G) = n/(n+N) · gain(G)``  (the test checks it
  against materialised placeholders, and the bound by brute force over small ``n``, ``N``).
* Cost: scores shrink by ``n/(n+N)`` and the noise is that of ``N`` records.  Against the
  (non-private) calibration at ``n``, the noise relative to a gain grows by
  ``mi_sensitivity(N)·(n+N) / (n·mi_sensitivity(n))``: 2 at ``N = n``, about 1.3–1.6 for
  ``N`` from ``n·log n`` to ``100·n``, but about 8 at ``N = n/10``; ``min_records`` is best set
  near or above the usual hot-period size.
* No round is skipped for lack of records: the skip would be a data-dependent release (the
  epochs of the picks show it).  A small hot period gives scores near 0: nearly uniform picks
  between the candidates and ⊥ (below), which then wins about half the time at ``τ = 0``.

Selection (exponential mechanism, Gumbel report-noisy-max)
----------------------------------------------------------
The exponential mechanism (McSherry & Talwar, FOCS 2007) with score sensitivity ``Δ`` picks ``i``
with probability ``∝ exp(ε·u_i / (2Δ))``, ε-DP; the factor 2 is needed because gains are not
monotone (one record moves some gains up, others down).  By the Gumbel-max trick,
``argmax_i(u_i + β·G_i)`` with i.i.d. standard Gumbel ``G_i`` picks ``i`` with probability
``softmax(u/β)_i``; so ``β = 2Δ/ε``.  For ``k`` picks we take the top ``k`` of ``u_i + β·G_i`` in
ONE shot with ``β = 2kΔ/ε``: this has exactly the distribution of ``k`` successive exponential
mechanisms without replacement ("peeling"), each ``(ε/k)``-DP (Durfee & Rogers, "Practical
differentially private top-k selection with pay-what-you-get composition", NeurIPS 2019), hence
ε-DP for the round by basic composition.  (Durfee & Rogers and the bounded-range analysis of Dong,
Durfee & Rogers 2020 give tighter approximate-DP accounting; we keep pure ε for a simple ledger.)

Picking nothing: the public outcome ⊥ (``privacy.selection_threshold``)
-----------------------------------------------------------------------
With a threshold ``τ`` the mechanism's outcomes are the ``m`` candidates and ``⊥`` ("add no
table").  ``⊥`` stands for ``m`` public outcomes "stop", each of score ``τ``: its score is
``τ + β·log m``, ``β = 2k'Δ/ε`` the Gumbel scale, so

    P(⊥ first) = m·e^{τ/β} / (m·e^{τ/β} + Σ_i e^{u_i/β}) >= 1/2  iff  β·log mean_i e^{u_i/β} <= τ:

⊥ wins at least half the time when no candidate beats ``τ`` (the log-mean-exp of the scores
lies between their mean and their maximum), and a candidate must beat ``τ`` by about
``β·log m`` to be likelier than ⊥.  With a single outcome of score ``τ``, ⊥ would lose to ``m``
candidates scoring about ``τ`` with probability ``m/(m+1)``, and a round sees 20 or more
candidates, many of them within a noise scale of 0 (a group an existing table determines
scores exactly 0; one of pure noise features slightly below 0 in a hot period far smaller than
``min_records``): such a ⊥ would almost never stop a round.

* Privacy.  The exponential mechanism is ε-DP for any outcome set and any score function whose
  values move by at most ``Δ`` between neighbours: ``P_D(o)/P_D'(o) = exp(ε(u_o(D) − u_o(D'))
  /(2Δ)) · Z_D'/Z_D <= e^{ε/2} · e^{ε/2}``.  ⊥'s score depends only on public numbers (``τ``,
  ``ε``, ``Δ`` at ``min_records``, ``k`` and ``m``, which depends on table names only): its
  change is 0 <= Δ, so adding it keeps ε and the Gumbel scale.  For ``k`` picks the one-shot
  top-``k'`` of ``u_i + β·G_i`` over candidates ∪ {⊥} (``k' = min(k, m)``, ⊥ drawing its own
  Gumbel) is ``k'`` peeled mechanisms over that set, each ``ε/k'``-DP (Durfee & Rogers 2019);
  the round returns the picks ranked above ⊥ and stops there (post-processing: a pick after ⊥
  would be conditioned on it, and nothing is released of the rest).  ``τ`` must never be
  computed from the data (nor from ``n``).
* Units.  ``τ`` is compared with the scores the mechanism sees, those of the padded data set
  ``D*`` below: nats per record of the hot period plus ``min_records`` placeholders,
  ``n/(n+N) · score``.  ``τ = 0``, the default, is the only value that means the same at every
  private ``n``: ``aic > 0`` iff Akaike's criterion prefers the group to its best base, whatever
  the positive factor ``n/(n+N)``; so the round stops at least half the time when AIC prefers no
  candidate.  A positive ``τ`` asks a group to beat AIC by ``τ·(n+N)`` nats in all (``n`` is
  private, so it cannot be stated per real record).  ``β`` is in the same units (``2.7e-4`` at
  the defaults, ``L = 2``, ``ε = 1``, ``k = 1``).  With ``"mi"`` every score is ``>= 0``
  (clipped, and biased up by about ``(L−1)ΔK/(2n)``), so ``τ = 0`` stops a round only when
  every gain is within the noise of 0.
* Without a threshold (``None``) every round picks ``k'`` groups, the behaviour before.

The margin (``privacy.selection_margin``)
----------------------------------------
At ``τ`` alone a round whose candidates all score about ``τ`` (every group useless) still
picks one half of the time: ``P(⊥ first) = 1/2`` at ``u_i = τ``.  The margin ``c`` (in noise
scales ``β``, public) gives ⊥ the score ``τ + β·(c + log m)``, so with every ``u_i <= τ``

    P(a pick) = Σ_i e^{u_i/β} / (m·e^{τ/β + c} + Σ_i e^{u_i/β}) <= 1/(1 + e^c),

4.7 % at the default ``c = 3`` (a lower confidence bound on the gain, in the mechanism's own
noise), while a candidate ``δ`` above ``τ`` is likelier than ⊥ once ``δ > β·(c + log m)``.  The
margin is a public constant like ``τ``: privacy as above.  Measured on MovieLens: ``τ = 0``
alone picked 3-4 groups a stream that did not help (``BENCHMARKS.md``).

What is private
---------------
Only the picked GROUPS (and their order, and whether the round stopped at ⊥) are ε-DP
outputs.  A :class:`Candidate`'s ``base`` and
``feature`` are chosen without looking at data (the first base in sorted order), but its
``gain`` is the EXACT score on hot data: it must never be stored, logged or returned by an API.
The sensitivity is calibrated to the public ``min_records``, never to the hot period's count.
Floating-point caveat: Gumbel noise is a float64 transform of 52 uniform CSPRNG bits, not an
exact sampler.  ``u = (k + 0.5)/2**52`` lies in ``[2**-53, 1 − 2**-53]``, so ``G = −log(−log u)``
lies in ``[−log(53·ln 2), 53·ln 2] = [−3.60, 36.74]``: the noise is truncated.  An ideal
standard Gumbel falls outside that range with probability
``(1 − exp(−e^−36.74)) + exp(−e^3.60) ≈ 2·e^−36.74 ≈ 2.2e-16``, so the implemented round
differs from the ideal ε-DP one only on an event of probability at most ``m′·2.2e-16`` (m′ the
candidates and ⊥): as a guarantee, (ε, δ) with ``δ ≈ m′·e^−36`` (below 1e-13 for a thousand
candidates), which the ledger does not add (truncated noise is why no pure ε covers it: an
outcome that needs a Gumbel above 36.74 to win has probability 0 on one data set, positive on
a neighbour).  The rounding of u to its grid (a coupling with the ideal uniform,
``|u − u′| ≤ 2**-53``) moves G by at most ``2**-53/(u·|log u|)``: at most 1e-6 unless
``u`` or ``1 − u`` is below about 1.1e-10 (probability 2.2e-10 per draw), and noise moved by at
most s scales moves every outcome's probability by at most e^{2s}.  In all, a round is about
``(ε + 2e-6, m′·2.3e-10)``-DP against the ideal ε; neither term is added by the ledger
(Ilvento, CCS 2020, "Implementing the exponential mechanism with base-2 differential privacy",
gives an exact alternative).

Randomness
----------
``gumbel(size)`` is injected; the default :func:`csprng_gumbel` reads ``os.urandom`` only, never
a seeded or global PRNG.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "Candidate",
    "candidate_groups",
    "csprng_gumbel",
    "empirical_mi",
    "gain_sensitivity",
    "group_codes",
    "mi_sensitivity",
    "padded_weight",
    "score_candidates",
    "select",
    "select_round",
    "score_sensitivity",
    "SCORES",
]

SCORES = ("aic", "mi")  # the candidate scores (module docstring); the stream config's default: aic

Int64Array = NDArray[np.int64]
FloatArray = NDArray[np.float64]
GumbelSource = Callable[[int], NDArray[np.floating]]

_UNIFORM_BITS = 52  # (k + 0.5) / 2**52 is exact in float64 and lies in [2**-53, 1 - 2**-53]


@dataclass(frozen=True)
class Candidate:
    """A candidate group: ``group = sorted(base + (feature,))``, scored by ``gain`` (nats).

    ``gain`` is the exact score on hot data, NOT a private output (see the module docstring).
    """

    base: tuple[str, ...]
    feature: str
    group: tuple[str, ...]
    gain: float

    def __post_init__(self) -> None:
        if self.feature in self.base:
            raise ValueError(f"feature must not be in base, got {self.feature=} {self.base=}")
        if self.group != tuple(sorted((*self.base, self.feature))):
            raise ValueError(
                f"group must be sorted(base + (feature,)), got {self.group=} for "
                f"{self.base=} {self.feature=}"
            )
        if not math.isfinite(self.gain):
            raise ValueError(f"gain must be finite, got {self.gain=}")


# ----------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------


def _check_int(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")
    return int(value)


def _check_epsilon(epsilon: object) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
        raise TypeError(f"epsilon must be a real number, got {epsilon!r}")
    eps = float(epsilon)
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon=}")
    return eps


def _int_vector(name: str, values: object, n: int | None = None) -> Int64Array:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.dtype == np.bool_ or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
    if n is not None and arr.size != n:
        raise ValueError(f"{name} must have {n} entries (one per record), got {arr.size}")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} has values above the int64 range")
    return arr.astype(np.int64, copy=False)


def _labels(labels: object, n_labels: int) -> Int64Array:
    y = _int_vector("labels", labels)
    if y.size and (int(y.min()) < 0 or int(y.max()) >= n_labels):
        raise ValueError(
            f"labels must lie in [0, n_labels) = [0, {n_labels}), "
            f"got min {int(y.min())}, max {int(y.max())}"
        )
    return y


def _dense(codes: Int64Array) -> tuple[Int64Array, int]:
    """Relabel codes to 0..K-1 (order-preserving), K = number of distinct codes."""
    if codes.size == 0:
        return codes.astype(np.int64), 0
    lo, hi = int(codes.min()), int(codes.max())
    span = hi - lo + 1
    if span <= 4 * codes.size + 1024:  # cheap table lookup instead of a sort
        shifted = codes - lo
        present = np.bincount(shifted, minlength=span) > 0
        remap = np.cumsum(present, dtype=np.int64) - 1
        return remap[shifted], int(present.sum())
    uniq, inverse = np.unique(codes, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), int(uniq.size)


def _combine(a: Int64Array, k_a: int, b: Int64Array, k_b: int) -> tuple[Int64Array, int]:
    """Joint dense codes of two dense code vectors (k_a * k_b <= n**2 fits int64 for n < 3e9)."""
    return _dense(a * k_b + b)


def _mi_dense(codes: Int64Array, n_codes: int, labels: Int64Array, n_labels: int) -> float:
    """Plug-in MI in nats of dense codes in [0, n_codes) against labels in [0, n_labels)."""
    n = labels.size
    if n == 0:
        return 0.0
    cells = codes * n_labels + labels
    if n_codes * n_labels <= 4 * n + 1024:
        table = np.bincount(cells, minlength=n_codes * n_labels)
        occupied = np.flatnonzero(table)
        counts = table[occupied]
    else:
        occupied, counts = np.unique(cells, return_counts=True)
    a = np.bincount(codes, minlength=n_codes)[occupied // n_labels]
    b = np.bincount(labels, minlength=n_labels)[occupied % n_labels]
    c = counts.astype(np.float64)
    terms = c * (np.log(c) + math.log(n) - np.log(a.astype(np.float64)) - np.log(b))
    return max(0.0, float(terms.sum()) / n)  # >= 0 exactly; the clip only removes rounding


# ----------------------------------------------------------------------------------------------
# empirical mutual information and its sensitivity
# ----------------------------------------------------------------------------------------------


def group_codes(columns: Sequence[np.ndarray]) -> Int64Array:
    """Joint codes of integer-coded feature columns: equal rows <=> equal codes.

    Returns int64 codes in ``[0, K)``, K the number of distinct rows, ordered like the rows'
    lexicographic order; equivalent to ``np.unique(np.stack(columns, 1), axis=0,
    return_inverse=True)[1]`` but built column by column (mixed radix, re-densified).
    """
    if len(columns) == 0:
        raise ValueError("group_codes needs at least one column")
    first = _int_vector("columns[0]", columns[0])
    codes, k = _dense(first)
    for i, column in enumerate(columns[1:], start=1):
        col, k_col = _dense(_int_vector(f"columns[{i}]", column, first.size))
        codes, k = _combine(codes, k, col, k_col)
    return codes


def empirical_mi(codes: np.ndarray, labels: np.ndarray, *, n_labels: int) -> float:
    """Plug-in mutual information ``Î(X; Y)`` in nats.

    ``Î = Σ_{x,y} (c_xy/n) log(n c_xy / (a_x b_y)) = H(X) + H(Y) − H(X, Y)`` over the
    contingency table of ``codes`` (any integers, e.g. :func:`group_codes`) and ``labels`` in
    ``[0, n_labels)``; 0 for no records.  Always in ``[0, log min(n_labels, n)]``.
    """
    n_labels = _check_int("n_labels", n_labels, minimum=1)
    y = _labels(labels, n_labels)
    x = _int_vector("codes", codes, y.size)
    dense, k = _dense(x)
    return _mi_dense(dense, k, y, n_labels)


def _phi(m: int) -> float:
    """φ(m) = (m+1) log(m+1) − m log m: the growth of n·H when a record joins a cell of m."""
    return (m + 1) * math.log(m + 1) - (m * math.log(m) if m > 0 else 0.0)


def _pair_bound(m: int, n_labels: int) -> float:
    """g(m): max |Î(D') − Î(D)| over D of m records and D' = D plus one record."""
    if m == 0:
        return 0.0  # both datasets have Î = 0
    half_split = _phi(m // 2) + _phi(m - m // 2) - _phi(m)  # B(m)
    return max(_phi(m), half_split + math.log(min(n_labels, m))) / (m + 1)


def mi_sensitivity(*, n: int, n_labels: int) -> float:
    """Sensitivity of empirical MI (nats) for a dataset of n records, add/remove-one neighbours.

    ``max(g(n−1), g(n))`` with ``g(m) = max(φ(m), B(m) + log min(L, m)) / (m+1)``,
    ``φ(m) = (m+1)log(m+1) − m log m``, ``B(m) = φ(⌊m/2⌋) + φ(⌈m/2⌉) − φ(m)``, derived in the
    module docstring.  For ``L <= 3`` labels and ``n >= 2`` it equals ``h(1/n)`` (binary entropy,
    nats), which is attained.  Independent of the feature alphabet; non-increasing in n, so a
    public lower bound on the record count may be passed as ``n``.
    """
    n = _check_int("n", n, minimum=1)
    n_labels = _check_int("n_labels", n_labels, minimum=1)
    return max(_pair_bound(n - 1, n_labels), _pair_bound(n, n_labels))


def gain_sensitivity(*, n: int, n_labels: int) -> float:
    """Sensitivity of ``gain = Î(t ∪ {f}; Y) − Î(t; Y)`` (and of its minimum over bases).

    Equal to :func:`mi_sensitivity`, not twice it: in the difference the ``φ(n)`` and label
    terms cancel and what is left obeys the same two one-sided bounds (module docstring).
    """
    return mi_sensitivity(n=n, n_labels=n_labels)


def _check_score(score: object) -> str:
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    return str(score)


def score_sensitivity(*, score: str, n: int, n_labels: int) -> float:
    """Sensitivity of a candidate score on ``n`` records (add/remove-one neighbours).

    ``"mi"``: :func:`gain_sensitivity`.  ``"aic"``: ``gain_sensitivity + (L−1)/n``, the
    penalty ``(L−1)(K_G − K_t)/n`` moving by at most ``(L−1)/n`` (module docstring, "Penalised
    score"); non-increasing in ``n``, so a public lower bound on the count may be passed.
    """
    score = _check_score(score)
    n = _check_int("n", n, minimum=1)
    n_labels = _check_int("n_labels", n_labels, minimum=1)
    base = gain_sensitivity(n=n, n_labels=n_labels)
    return base if score == "mi" else base + (n_labels - 1) / n


# ----------------------------------------------------------------------------------------------
# candidates
# ----------------------------------------------------------------------------------------------


def _normalise_tables(
    tables: Sequence[tuple[str, ...]], features: Mapping[str, object]
) -> list[tuple[str, ...]]:
    seen: set[tuple[str, ...]] = set()
    out: list[tuple[str, ...]] = []
    for table in tables:
        if isinstance(table, str) or not isinstance(table, tuple) or not table:
            raise ValueError(
                f"each table must be a non-empty tuple of feature names, got {table!r}"
            )
        group = tuple(sorted(table))
        if len(set(group)) != len(group):
            raise ValueError(f"a table names a feature twice: {table!r}")
        unknown = [f for f in group if f not in features]
        if unknown:
            raise ValueError(f"table {table!r} uses features without a column: {unknown}")
        if group in seen:
            raise ValueError(f"duplicate table {group!r}")
        seen.add(group)
        out.append(group)
    return out


def _determined(
    table: tuple[str, ...], features: Sequence[str], attributes: Mapping[str, str]
) -> set[str]:
    """The features a table's key determines: its own and every (transitive) attribute of them
    (``attributes``: feature -> the feature it is an attribute of, the stream's ``of``)."""
    out = set(table)
    for f in features:
        parent = attributes.get(f)
        while parent is not None and f not in out:
            if parent in table:
                out.add(f)
            parent = attributes.get(parent)
    return out


def _candidate_bases(
    tables: list[tuple[str, ...]],
    features: Sequence[str],
    attributes: Mapping[str, str] | None = None,
) -> dict[tuple[str, ...], list[tuple[str, ...]]]:
    """Candidate group -> its bases: every (normalised) table whose features are a proper subset
    of the group's.  Groups are the tables extended by one feature that are not tables, nor
    determined by one (``attributes``: the stream's public "of" declarations: a group all of
    whose features a table's key determines would count what that table counts, coarser)."""
    existing = set(tables)
    groups = {
        tuple(sorted((*table, feature)))
        for table in tables
        for feature in features
        if feature not in table
    } - existing
    if attributes:
        closures = [_determined(t, features, attributes) for t in tables]
        groups = {g for g in groups if not any(set(g) <= c for c in closures)}
    return {g: sorted(t for t in tables if set(t) < set(g)) for g in sorted(groups)}


def candidate_groups(
    *,
    tables: Sequence[tuple[str, ...]],
    features: Sequence[str],
    attributes: Mapping[str, str] | None = None,
) -> list[tuple[str, ...]]:
    """The candidate groups of a round, sorted: a public function of the table and feature
    names and the stream's "of" declarations (no data), so a round with none may stop before
    reading anything."""
    names = {f: None for f in features}
    return list(_candidate_bases(_normalise_tables(tables, names), sorted(names), attributes))


def score_candidates(
    *,
    columns: Mapping[str, np.ndarray],
    labels: np.ndarray,
    n_labels: int,
    tables: Sequence[tuple[str, ...]],
    score: str = "mi",
    attributes: Mapping[str, str] | None = None,
) -> list[Candidate]:
    """Every group that extends an existing table by one feature, with its score (nats).

    ``columns`` maps feature names to integer-coded columns of the hot-period records,
    ``tables`` the stream's current tables (single features and selected groups; the prior table
    is not listed).  Candidates are the groups ``sorted(t + (f,))`` for ``t`` in ``tables``,
    ``f`` in ``columns`` not in ``t``, that are not tables already, each once, sorted by group
    (:func:`candidate_groups`).  ``gain = Î(G; Y) − max_{t ∈ bases(G)} Î(t; Y)`` clipped at 0,
    bases(G) every table that is a proper subset of ``G``; ``base`` is the FIRST of them with
    one feature less, in sorted order (data-independent), ``feature`` the one feature of
    ``group`` not in it.  The candidate list depends only on the table and feature names,
    never on the data.  With ``score="aic"`` the ``gain`` field holds instead
    ``min_t [Î(G; Y) − Î(t; Y) − (L−1)(K_G − K_t)/n]``, unclipped, ``K`` the occupied cells
    (module docstring, "Penalised score"), 0 when there are no records.
    """
    score = _check_score(score)
    n_labels = _check_int("n_labels", n_labels, minimum=1)
    y = _labels(labels, n_labels)
    for name in columns:
        if not isinstance(name, str):
            raise TypeError(f"feature names must be str, got {name!r}")
    norm = _normalise_tables(tables, columns)
    bases = _candidate_bases(norm, sorted(columns), attributes)
    if not bases:
        return []

    dense_columns: dict[str, tuple[Int64Array, int]] = {}

    def column(name: str) -> tuple[Int64Array, int]:
        if name not in dense_columns:
            dense_columns[name] = _dense(_int_vector(f"columns[{name!r}]", columns[name], y.size))
        return dense_columns[name]

    table_codes: dict[tuple[str, ...], tuple[Int64Array, int]] = {}
    table_mi: dict[tuple[str, ...], float] = {}
    penalty = (n_labels - 1) / y.size if (score == "aic" and y.size) else 0.0
    for table in sorted({b for bs in bases.values() for b in bs}):
        codes, k = column(table[0])
        for name in table[1:]:
            codes, k = _combine(codes, k, *column(name))
        table_codes[table] = (codes, k)
        table_mi[table] = _mi_dense(codes, k, y, n_labels)

    candidates: list[Candidate] = []
    for group in sorted(bases):
        group_bases = bases[group]  # sorted
        base = next(b for b in group_bases if len(b) == len(group) - 1)
        (feature,) = set(group) - set(base)
        codes, k = _combine(*table_codes[base], *column(feature))
        mi = _mi_dense(codes, k, y, n_labels)
        if score == "mi":
            value = max(0.0, mi - max(table_mi[b] for b in group_bases))
        else:  # K_G = k cells of G; K_t = table_codes[b][1] cells of base b
            value = min(
                max(0.0, mi - table_mi[b]) - penalty * (k - table_codes[b][1]) for b in group_bases
            )
        candidates.append(Candidate(base=base, feature=feature, group=group, gain=value))
    return candidates


# ----------------------------------------------------------------------------------------------
# the exponential mechanism
# ----------------------------------------------------------------------------------------------


def csprng_gumbel(size: int) -> FloatArray:
    """``size`` standard Gumbel(0, 1) samples from ``os.urandom``: ``−log(−log(u))``.

    ``u = (k + 0.5) / 2**52`` with ``k`` the top 52 bits of a urandom 64-bit word: exact in
    float64, uniform on a 2**52-point grid strictly inside (0, 1) (``2**-53 <= u <= 1 − 2**-53``),
    so both logarithms are finite (the output lies in about [−3.6, 36.7]).
    """
    size = _check_int("size", size, minimum=0)
    words = np.frombuffer(os.urandom(8 * size), dtype="<u8") >> np.uint64(64 - _UNIFORM_BITS)
    u = (words.astype(np.float64) + 0.5) * 2.0**-_UNIFORM_BITS
    return -np.log(-np.log(u))


def _check_threshold(threshold: object) -> float | None:
    if threshold is None:
        return None
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
        raise TypeError(f"threshold must be a real number or None, got {threshold!r}")
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold=}")
    return float(threshold)


MARGIN_MAX = 32.0


def _check_margin(margin: object) -> float:
    if isinstance(margin, bool) or not isinstance(margin, numbers.Real):
        raise TypeError(f"margin must be a real number, got {margin!r}")
    value = float(margin)
    if not 0 <= value <= MARGIN_MAX:
        raise ValueError(f"margin must be in [0, {MARGIN_MAX:g}] noise scales, got {margin=}")
    return value


def select(
    *,
    candidates: Sequence[Candidate],
    k: int,
    epsilon: float,
    sensitivity: float,
    gumbel: GumbelSource | None = None,
    threshold: float | None = None,
    margin: float = 0.0,
) -> list[Candidate]:
    """Up to ``k`` distinct candidates by one-shot Gumbel top-k: ε-DP in total.

    Returns the ``k' = min(k, len(candidates))`` candidates with the largest
    ``gain_i + β·G_i``, ``β = 2·k'·sensitivity/ε``, ``G_i = gumbel(len(candidates))``
    (default :func:`csprng_gumbel`), in decreasing order; ties go to the earlier candidate.
    This is distributed as ``k'`` peeled exponential mechanisms (McSherry & Talwar 2007) with
    ``ε/k'`` each (Durfee & Rogers 2019), so ε-DP by basic composition when ``sensitivity``
    bounds every gain's change between neighbours.  ``ε = 0`` or ``k = 0`` picks nothing.

    With a ``threshold`` τ the outcomes include ⊥ ("add no table"), ``m = len(candidates)``
    public "stop" outcomes of score τ each, i.e. one of score ``τ + β·log m``, drawn last
    (``gumbel(m + 1)``, its noise the last value): only the candidates ranked above ⊥ are
    returned, so ``[]`` when ⊥ comes first.  ⊥'s score depends on public numbers only
    (sensitivity 0), so the round stays ε-DP at the same β (module docstring, "Picking
    nothing").  τ is in the units of the gains passed (for :func:`select_round`, the padded
    scores) and must not depend on the data.  ``margin`` c (noise scales, ≥ 0) raises ⊥'s
    score to ``τ + β·(c + log m)``: when no candidate scores above τ a round picks with
    probability at most ``1/(1 + e^c)`` (module docstring, "The margin").
    """
    k = _check_int("k", k, minimum=0)
    eps = _check_epsilon(epsilon)
    tau = _check_threshold(threshold)
    margin = _check_margin(margin)
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, numbers.Real):
        raise TypeError(f"sensitivity must be a real number, got {sensitivity!r}")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be finite and > 0, got {sensitivity=}")
    groups = [c.group for c in candidates]
    if len(set(groups)) != len(groups):
        raise ValueError("candidates must have distinct groups")
    picks = min(k, len(candidates))
    if eps == 0 or picks == 0:
        return []
    scale = 2.0 * picks * float(sensitivity) / eps
    # m outcomes at τ + β·c
    stop = [] if tau is None else [tau + scale * (margin + math.log(len(candidates)))]
    scores = [c.gain for c in candidates] + stop
    draw = csprng_gumbel if gumbel is None else gumbel
    noise = np.asarray(draw(len(scores)), dtype=np.float64)
    if noise.shape != (len(scores),) or not np.all(np.isfinite(noise)):
        raise ValueError(
            f"gumbel({len(scores)}) must return {len(scores)} finite values, "
            f"got shape {noise.shape}"
        )
    noisy = np.array(scores, dtype=np.float64) + scale * noise
    picked: list[Candidate] = []
    for i in np.argsort(-noisy, kind="stable")[:picks].tolist():
        if i == len(candidates):  # ⊥: the round stops here
            break
        picked.append(candidates[i])
    return picked


def padded_weight(*, n: int, min_records: int) -> float:
    """``n/(n + N)``: the factor by which ``N = min_records`` placeholder records scale every
    gain of a hot period of ``n`` records (module docstring, "Public calibration")."""
    n = _check_int("n", n, minimum=0)
    min_records = _check_int("min_records", min_records, minimum=1)
    return n / (n + min_records)


def select_round(
    *,
    columns: Mapping[str, np.ndarray],
    labels: np.ndarray,
    n_labels: int,
    tables: Sequence[tuple[str, ...]],
    max_tables: int,
    groups_per_round: int,
    epsilon: float,
    min_records: int,
    gumbel: GumbelSource | None = None,
    score: str = "mi",
    threshold: float | None = None,
    margin: float = 0.0,
    attributes: Mapping[str, str] | None = None,
) -> list[Candidate]:
    """One selection round (docs/ARCHITECTURE.md, "Count-table selection"): the new groups to
    count (from the window after next on: ``service.selection``).

    Picks ``k = min(groups_per_round, max_tables − len(tables) − 1)`` (the prior table counts)
    groups from :func:`score_candidates` with :func:`select`, each scored on the hot period plus
    ``min_records`` public placeholder records: ``score = n/(n + min_records) · gain``
    (:func:`padded_weight`) at sensitivity :func:`gain_sensitivity` ``(min_records, n_labels)``
    (module docstring, "Public calibration"). ε-DP for every hot-period record at every size
    ``n = len(labels)``, 0 included; the noise scale does not depend on ``n``. Returns ``[]``
    when there is no room, ``epsilon == 0`` or no candidate. Only the returned GROUPS are
    private outputs; their ``gain`` is the exact gain (unweighted) and must stay in the worker.
    ``score`` chooses the candidate score (:data:`SCORES`; "aic" with sensitivity
    :func:`score_sensitivity`, scaled by the same ``n/(n + min_records)``); the stream
    configuration passes its ``privacy.selection_score`` (default "aic"). ``threshold``: the
    score of the public outcome ⊥ (:func:`select`), in the units of the padded scores; ``[]``
    is then also the outcome "⊥ first" (the stream configuration's
    ``privacy.selection_threshold``, default 0); ``margin``: ⊥'s extra score in noise scales
    (``privacy.selection_margin``, default 3); ``attributes``: the stream's "of" declarations
    (feature -> the feature it is an attribute of), which leave out the groups a table already
    determines (:func:`candidate_groups`).
    """
    score = _check_score(score)
    max_tables = _check_int("max_tables", max_tables, minimum=1)
    groups_per_round = _check_int("groups_per_round", groups_per_round, minimum=0)
    eps = _check_epsilon(epsilon)
    threshold = _check_threshold(threshold)
    n_labels = _check_int("n_labels", n_labels, minimum=1)
    min_records = _check_int("min_records", min_records, minimum=1)
    room = max_tables - len(tables) - 1
    if room < 0:
        raise ValueError(
            f"{len(tables)} tables plus the prior table exceed {max_tables=}; the noise "
            "calibrated to max_tables would no longer cover them"
        )
    y = _labels(labels, n_labels)
    picks = min(groups_per_round, room)
    if eps == 0 or picks == 0:
        _normalise_tables(tables, columns)  # still reject malformed input
        return []
    candidates = score_candidates(
        columns=columns,
        labels=y,
        n_labels=n_labels,
        tables=tables,
        score=score,
        attributes=attributes,
    )
    weight = padded_weight(n=y.size, min_records=min_records)
    scored = [replace(c, gain=weight * c.gain) for c in candidates]
    sensitivity = score_sensitivity(score=score, n=min_records, n_labels=n_labels)
    picked = select(
        candidates=scored,
        k=picks,
        epsilon=eps,
        sensitivity=sensitivity,
        gumbel=gumbel,
        threshold=threshold,
        margin=margin,
    )
    exact = {c.group: c for c in candidates}
    return [exact[c.group] for c in picked]
