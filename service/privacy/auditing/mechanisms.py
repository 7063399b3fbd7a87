"""The mechanisms the audit draws from, each as the service runs it, on a neighbouring pair of
inputs found by search, with the ε the service claims for that pair's relation; and the planted
bugs (the same code paths with one defect each) that the audit must catch.

Every builder returns a :class:`Case`: ``sample(n)`` draws ``n`` releases on each input (fresh
CSPRNG noise from the service's own samplers) and maps each release to a real test statistic
(the privacy loss the auditor expects; a wrong statistic costs power, never validity)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.stats import binom

from service.core.annotation import sampled_kanon as kanon
from service.core.annotation.sampling import bernoulli_mask
from service.core.dp.budget import window_multiplier
from service.core.dp.noise import RandomBits, discrete_laplace, zcdp_to_approx_dp
from service.core.dp.selection import select
from service.core.reidentification import attacks as pu
from service.privacy.auditing.streams import SmallStream, datasets, neighbours
from service.privacy.service import ledger
from service.queues.service import default_epsilon
from service.windows.service import noise_tables

FloatArray = NDArray[np.float64]
Sampler = Callable[[int], tuple[FloatArray, FloatArray]]

NEIGHBOUR_WORDS = {
    "add_remove": "add or remove one observation",
    "replace": "replace one observation",
    "user": "add or remove one user",
    "record": "add or remove one record",
    "candidate": "add or remove one candidate",
}


@dataclass(frozen=True)
class Case:
    """One audit: a mechanism, a neighbour relation, the pair found for it, the claim."""

    mechanism: str
    relation: str
    claimed_epsilon: float
    delta: float
    claim_source: str
    sample: Sampler
    pair_epsilon: float | None = None  # the pair's exact privacy loss, where computed
    planted: str | None = None  # the planted bug; None: the service's own mechanism


# -- count tables ----------------------------------------------------------------------------


def table_releases(mechanism: str, truth: np.ndarray, scales: np.ndarray, n: int) -> np.ndarray:
    """``n`` releases of the cells ``truth`` (their exact counts) with fresh noise from the
    window's own noise function (``service.windows.service.noise_tables``, one "table" of ``n``
    cells per coordinate at its scale): ``n × len(truth)``. Cells the pair does not change are
    left out: their noise is independent of the data, so no test gains from them."""
    ids = list(range(truth.size))
    tables, _ = noise_tables(mechanism, [float(s) for s in scales], float(scales[0]), ids, n, 0)
    return truth[None, :] + np.stack([tables[i] for i in ids], axis=1)


def table_statistic(
    mechanism: str, x: np.ndarray, a: np.ndarray, b: np.ndarray, scales: np.ndarray
) -> FloatArray:
    """The log-likelihood ratio ln P_b(x)/P_a(x) of the released cells: Laplace
    Σ (|x − a| − |x − b|)/s, Gaussian Σ ((x − a)² − (x − b)²)/(2σ²)."""
    xf = x.astype(np.float64)
    if mechanism == "laplace":
        out: FloatArray = ((np.abs(xf - a) - np.abs(xf - b)) / scales).sum(axis=1)
    else:
        out = (((xf - a) ** 2 - (xf - b) ** 2) / (2.0 * scales**2)).sum(axis=1)
    return out


def worst_table_pair(
    stream: SmallStream, relation: str, scales: np.ndarray, *, max_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The neighbouring pair (over every data set of at most ``max_len`` observations) whose
    tables differ most for the noise: the largest Σ|d|/b (Laplace: that pair's exact ε) or
    Σ d²/σ² (Gaussian). Returns the two tables' differing cells' counts, their scales and that
    figure."""
    sets = datasets(len(stream.domain), max_len, ordered=stream.user_key is not None)
    vec = {s: stream.tables(s) for s in sets}
    gaussian = stream.cfg.privacy.mechanism == "gaussian"
    best, best_pair = -1.0, (sets[0], sets[0])
    for x, y in neighbours(stream, sets, relation):
        d = vec[x] - vec[y]
        loss = float((d * d / scales**2).sum()) if gaussian else float((np.abs(d) / scales).sum())
        if loss > best:
            best, best_pair = loss, (x, y)
    a, b = vec[best_pair[1]], vec[best_pair[0]]
    idx = np.flatnonzero(a != b)
    return a[idx], b[idx], scales[idx], best


def count_tables(
    stream: SmallStream,
    relation: str,
    *,
    max_len: int | None = None,
    scale_factor: float = 1.0,
    claim: float | None = None,
    planted: str | None = None,
    label: str = "",
) -> Case:
    """A window's count tables on the worst pair of ``relation`` (``worst_table_pair``).
    The claim: the ledger's per-observation count-table ε (add/remove; twice it for replace:
    one removal and one addition), or per user one window's (m/k)·ε (Laplace) or the
    (ε, δ) of (m/k)²·ρ-zCDP (Gaussian) at the ledger's δ. ``scale_factor`` and ``claim``
    plant a bug (the noise the tables get, the ε stated). ``max_len``: by default 3 without
    a user key, c + 1 with one (a user's c counted observations and the one a removal lets
    in)."""
    cfg = stream.cfg
    p = cfg.privacy
    if max_len is None:
        max_len = p.max_contributions_per_window + 1 if p.user_key else 3
    mech = p.mechanism
    scales_all = stream.scales() * scale_factor
    a, b, idx_scales, loss = worst_table_pair(stream, relation, scales_all, max_len=max_len)
    led = ledger(cfg)
    part = led["observation"]["parts"][0]
    delta = p.delta if mech == "gaussian" else 0.0
    if relation == "user":
        mult = window_multiplier(cfg, level="user")
        if mech == "laplace":
            assert p.epsilon is not None
            stated = p.epsilon * mult
        else:
            assert p.rho is not None
            stated = zcdp_to_approx_dp(rho=p.rho * mult**2, delta=delta)
        source = "one window's (m/k)·ε, m = c (service.core.dp.budget.window_multiplier)"
    else:
        group = 2 if relation == "replace" else 1
        stated = group * part["epsilon"]
        delta = group * part["delta"]
        source = "ledger: observation, count_tables" + (
            " × 2 (replace = remove + add)" if group == 2 else ""
        )
    pair_eps = loss if mech == "laplace" else None

    def sample(n: int) -> tuple[FloatArray, FloatArray]:
        x0 = table_releases(mech, a, idx_scales, n)
        x1 = table_releases(mech, b, idx_scales, n)
        return (
            table_statistic(mech, x0, a, b, idx_scales),
            table_statistic(mech, x1, a, b, idx_scales),
        )

    who = "per user" if relation == "user" else "per observation"
    keyed = (
        f"user key, c = {p.max_contributions_per_window}, calibration {p.table_calibration}"
        if p.user_key
        else "no user key"
    )
    return Case(
        mechanism=f"count tables {who}, {mech} ({keyed}){label}",
        relation=NEIGHBOUR_WORDS[relation],
        claimed_epsilon=stated if claim is None else claim,
        delta=delta,
        claim_source=source if claim is None else "planted: " + (planted or ""),
        sample=sample,
        pair_epsilon=pair_eps,
        planted=planted,
    )


# -- a selection round -----------------------------------------------------------------------


def _log_ratio(lp1: np.ndarray, lp0: np.ndarray) -> np.ndarray:
    """ln P_1(o)/P_0(o) per outcome; 0 for an outcome impossible on both (⊥ without a
    threshold)."""
    both = np.isneginf(lp1) & np.isneginf(lp0)
    return np.where(both, 0.0, lp1 - np.where(both, 0.0, lp0))


def _selection_pair(
    stream: SmallStream, sets: Sequence[tuple[int, ...]]
) -> tuple[tuple[int, ...], tuple[int, ...], float]:
    """The add/remove pair whose one-round outcome distributions differ most (max over
    outcomes of |ln P_D(o)/P_D'(o)|, exactly)."""
    scores = {s: np.array([c.gain for c in stream.selection_scores(s)]) for s in sets}
    logp = {s: stream.selection_log_probs(v) for s, v in scores.items()}
    best, pair = -1.0, (sets[0], sets[0])
    for x, y in neighbours(stream, sets, "add_remove"):
        loss = float(np.abs(_log_ratio(logp[x], logp[y])).max())
        if loss > best:
            best, pair = loss, (x, y)
    return pair[1], pair[0], best


def _round_outcomes(stream: SmallStream, data: tuple[int, ...], n: int) -> np.ndarray:
    """``n`` outcomes of the service's ``select`` (one group, ⊥ allowed, CSPRNG Gumbel noise)
    on ``data``'s padded scores: the picked candidate's index, or the number of candidates
    for ⊥."""
    p = stream.cfg.privacy
    cands = stream.selection_scores(data)
    index = {c.group: i for i, c in enumerate(cands)}
    sens = stream.selection_sensitivity()
    out = np.empty(n, np.int64)
    for i in range(n):
        picked = select(
            candidates=cands,
            k=1,
            epsilon=p.epsilon_selection,
            sensitivity=sens,
            threshold=p.selection_threshold,
            margin=p.selection_margin,
        )
        out[i] = index[picked[0].group] if picked else len(cands)
    return out


def selection_round(stream: SmallStream, *, max_len: int = 4) -> Case:
    """One selection round (exponential mechanism with ⊥ and margin) on the add/remove pair
    with the largest exact loss among every multiset of at most ``max_len`` records. Claim:
    the ledger's ε per round."""
    p = stream.cfg.privacy
    if p.groups_per_round != 1:
        raise ValueError("the audit's statistic assumes one group per round")
    sets = datasets(len(stream.domain), max_len, ordered=False)
    d0, d1, loss = _selection_pair(stream, sets)
    lp0 = stream.selection_log_probs(np.array([c.gain for c in stream.selection_scores(d0)]))
    lp1 = stream.selection_log_probs(np.array([c.gain for c in stream.selection_scores(d1)]))
    llr = _log_ratio(lp1, lp0)

    def sample(n: int) -> tuple[FloatArray, FloatArray]:
        return llr[_round_outcomes(stream, d0, n)], llr[_round_outcomes(stream, d1, n)]

    parts = {q["name"]: q for q in ledger(stream.cfg)["observation"]["parts"]}
    return Case(
        mechanism=f"selection round (exponential mechanism, score {p.selection_score}, "
        + (
            "no ⊥)"
            if p.selection_threshold is None
            else f"⊥ at {p.selection_threshold:g}, margin {p.selection_margin:g})"
        ),
        relation=NEIGHBOUR_WORDS["add_remove"],
        claimed_epsilon=float(parts["table_selection"]["parameters"]["epsilon_per_round"]),
        delta=0.0,
        claim_source="ledger: observation, table_selection, ε per round",
        sample=sample,
        pair_epsilon=loss,
    )


# -- the ledger's composition for a stream ---------------------------------------------------


def composition(stream: SmallStream, *, max_len: int = 3) -> Case:
    """One observation's releases as the ledger composes them for a stream without a user
    key: its window's count tables and the ``min(H, Q)`` selection rounds that read it, all
    on the same pair (the one with the largest Σ of the tables' ε and the rounds' exact
    losses). Claim: the ledger's per-observation ε (basic composition)."""
    cfg = stream.cfg
    p = cfg.privacy
    if p.user_key or p.mechanism != "laplace":
        raise ValueError("the composition audit takes a Laplace stream without a user key")
    led = ledger(cfg)["observation"]
    rounds = sum(
        int(q["parameters"]["rounds"]) for q in led["parts"] if q["name"] == "table_selection"
    )
    scales = stream.scales()
    sets = datasets(len(stream.domain), max_len, ordered=False)
    vec = {s: stream.tables(s) for s in sets}
    logp = {
        s: stream.selection_log_probs(np.array([c.gain for c in stream.selection_scores(s)]))
        for s in sets
    }
    best, pair = -1.0, (sets[0], sets[0])
    for x, y in neighbours(stream, sets, "add_remove"):
        loss = float((np.abs(vec[x] - vec[y]) / scales).sum()) + rounds * float(
            np.abs(_log_ratio(logp[x], logp[y])).max()
        )
        if loss > best:
            best, pair = loss, (x, y)
    d0, d1 = pair[1], pair[0]
    idx = np.flatnonzero(vec[d0] != vec[d1])
    a, b, s = vec[d0][idx], vec[d1][idx], scales[idx]
    llr = _log_ratio(logp[d1], logp[d0])

    def one(data: tuple[int, ...], truth: np.ndarray, n: int) -> FloatArray:
        stat = table_statistic("laplace", table_releases("laplace", truth, s, n), a, b, s)
        for _ in range(rounds):
            stat = stat + llr[_round_outcomes(stream, data, n)]
        return stat

    def sample(n: int) -> tuple[FloatArray, FloatArray]:
        return one(d0, a, n), one(d1, b, n)

    return Case(
        mechanism=f"ledger composition: a window's tables + {rounds} selection rounds",
        relation=NEIGHBOUR_WORDS["add_remove"],
        claimed_epsilon=float(led["epsilon"]),
        delta=float(led["delta"]),
        claim_source="ledger: observation ε (basic composition)",
        sample=sample,
        pair_epsilon=None,
    )


# -- the annotation queue's release of one period --------------------------------------------


def queue_period(*, beta: float, k: int, at_kth_arrival: bool = False) -> Case:
    """One class of one period: N − 1 identical candidates against N (the added one arriving
    last), N = round((k − 1)/β) + 1, where the k-th sampled candidate is likeliest to be the
    last. Sampling is the service's ``bernoulli_mask`` (CSPRNG); a class is released when it
    holds k sampled candidates at the period's end (``queue_candidates.lua`` counts, the
    release reads the ready classes). Claim: (ε, δ) of Li, Qardaji & Su at the queue's
    default ε (``kanon.delta``). Planted (``at_kth_arrival``): the release happens at the
    k-th sampled arrival, so its time (the arrival's index) is observable."""
    eps = default_epsilon(beta)
    d = kanon.delta(k=k, beta=beta, epsilon=eps).delta
    big_n = round((k - 1) / beta) + 1

    def release(size: int, n: int) -> FloatArray:
        coins = bernoulli_mask(n * size, beta).reshape(n, size)
        if not at_kth_arrival:
            return (coins.sum(axis=1) >= k).astype(np.float64)
        cs = np.cumsum(coins, axis=1)
        reached = cs[:, -1] >= k
        return np.where(reached, np.argmax(cs >= k, axis=1) + 1, 0).astype(np.float64)

    def sample(n: int) -> tuple[FloatArray, FloatArray]:
        return release(big_n - 1, n), release(big_n, n)

    pair = None
    if not at_kth_arrival:  # exact: the output is one bit, P[released] = P[Bin(size, β) >= k]
        p1, p0 = float(binom.sf(k - 1, big_n, beta)), float(binom.sf(k - 1, big_n - 1, beta))
        ratios = [(p1 - d) / p0, (1 - p0 - d) / (1 - p1)]
        pair = max(0.0, *(math.log(r) for r in ratios if r > 0))

    return Case(
        mechanism=f"annotation queue, one period (β = {beta:g}, k = {k}, class of {big_n})"
        + (" released at the k-th arrival" if at_kth_arrival else ""),
        relation=NEIGHBOUR_WORDS["candidate"],
        claimed_epsilon=eps,
        delta=d,
        claim_source="Li–Qardaji–Su Thm 5 (service.core.annotation.sampled_kanon.delta)",
        sample=sample,
        pair_epsilon=pair,
        planted="release at the k-th arrival" if at_kth_arrival else None,
    )


# -- the re-identification audit's released mean ---------------------------------------------


def sum_release_batch(
    mech: pu.SumRelease, units: np.ndarray, n: int, *, bits: RandomBits | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` releases of ``SumRelease.draw(units)``: the same noise calls at the same scales
    (the sum's ``dimensions`` draws, then the count's one), batched; with ``n = 1`` and the
    same ``bits`` it returns exactly what ``draw`` returns (tested)."""
    d = mech.dimensions
    sums = np.empty((n, d), np.int64)
    counts = np.empty(n, np.int64)
    if n == 1:  # draw's own order of draws
        sums[0] = units.sum(axis=0) + discrete_laplace(scale=mech.sum_scale, size=d, bits=bits)
        counts[0] = len(units) + discrete_laplace(scale=mech.count_scale, size=1, bits=bits)[0]
        return sums, counts
    sums[:] = units.sum(axis=0)[None, :] + discrete_laplace(
        scale=mech.sum_scale, size=n * d, bits=bits
    ).reshape(n, d)
    counts[:] = len(units) + discrete_laplace(scale=mech.count_scale, size=n, bits=bits)
    return sums, counts


def reidentification_mean(*, epsilon: float = 1.0, dimensions: int = 2) -> Case:
    """The ε-DP class release of a re-identification audit (noisy sum and count,
    ``service.core.reidentification.attacks.SumRelease``) over the box [0, 1]^d: a class of one
    record at the centre
    against it plus the record of largest L1 norm among the box's corners and centre. Claim:
    the release's whole-record ε."""
    mech = pu.calibrate(pu.Domain.box(0.0, 1.0), dimensions=dimensions, epsilon=epsilon)
    base = mech.units(np.full((1, dimensions), 0.5))
    grid = [np.array(c, np.float64) for c in np.ndindex(*(3,) * dimensions)]
    added = max((mech.units(g[None, :] / 2.0) for g in grid), key=lambda u: int(np.abs(u).sum()))
    other = np.concatenate([base, added])
    s_scale, c_scale = float(mech.sum_scale), float(mech.count_scale)
    sa, sb = base.sum(axis=0).astype(np.float64), other.sum(axis=0).astype(np.float64)
    pair = float(np.abs(sb - sa).sum()) / s_scale + 1.0 / c_scale

    def stat(sums: np.ndarray, counts: np.ndarray) -> FloatArray:
        s = sums.astype(np.float64)
        c = counts.astype(np.float64)
        out: FloatArray = ((np.abs(s - sa) - np.abs(s - sb)) / s_scale).sum(axis=1) + (
            np.abs(c - 1) - np.abs(c - 2)
        ) / c_scale
        return out

    def sample(n: int) -> tuple[FloatArray, FloatArray]:
        return stat(*sum_release_batch(mech, base, n)), stat(*sum_release_batch(mech, other, n))

    return Case(
        mechanism=f"re-identification audit's class mean (d = {dimensions}, box [0, 1])",
        relation=NEIGHBOUR_WORDS["record"],
        claimed_epsilon=float(mech.guarantee()["epsilon"]),
        delta=0.0,
        claim_source="SumRelease.guarantee()",
        sample=sample,
        pair_epsilon=pair,
    )


def depth_forgotten(stream: SmallStream) -> float:
    """The scale factor of a sensitivity that forgets depth: Δ1 = k·T (not k·T·depth), so b
    is ``depth`` times too small (σ: sqrt(depth))."""
    depth = stream.cfg.sketch.depth
    return 1.0 / depth if stream.cfg.privacy.mechanism == "laplace" else 1.0 / math.sqrt(depth)
