"""Empirical-Bayes smoothed log-odds (service.core.features.shrinkage): exact values on
hand-computed cases, the limits (the prior at n̂ = 0, the key's own log-odds as its total grows
without noise), monotone in the total, the τ² estimate from a table's cells, and the featurizer
serving exactly these values from the noisy aggregate alone."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from service.core.features.columns import derived_columns
from service.core.features.featurizer import Featurizer
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.features.shrinkage import (
    MEDIAN_VARIANCE,
    between_variance,
    estimate_variance,
    log_odds,
    shrink,
)
from service.core.streamconfig import StreamCreate
from service.core.tables.aggregate import Aggregate
from service.core.tables.sketch import estimate, hash_keys

SEED = bytes(range(32))


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_two_labels_without_noise_by_hand() -> None:
    # ĉ = (3, 1), π = (½, ½), σ² = 0, τ² = 1: a = 1.5, b = 3.5, v = 2/3 + 2/7 = 20/21,
    # weight 1/(1 + 20/21) = 21/41, ℓ_prior = 0
    p, ell = shrink(np.array([[3.0, 1.0]]), prior=np.array([0.5, 0.5]), sigma2=0.0, tau2=np.ones(2))
    assert ell[0, 1] == pytest.approx(21 / 41 * math.log(1.5 / 3.5), rel=1e-12)
    assert p[0, 1] == pytest.approx(1 / (1 + math.exp(-21 / 41 * math.log(3 / 7))), rel=1e-12)


def test_two_labels_with_noise_by_hand() -> None:
    # ĉ = (10, 5), π = (¾, ¼), σ² = 4, τ² = 0.5: a = 5.25, b = 10.75
    prior = np.array([0.75, 0.25])
    _, ell = shrink(np.array([[10.0, 5.0]]), prior=prior, sigma2=4.0, tau2=np.full(2, 0.5))
    v = (5.25 + 4) / 5.25**2 + (10.75 + 4) / 10.75**2
    lp = logit(0.25)
    want = lp + 0.5 / (0.5 + v) * (math.log(5.25 / 10.75) - lp)
    assert ell[0, 1] == pytest.approx(want, rel=1e-12)
    # negative estimates are clamped at 0 first, as the count columns are
    _, ell_neg = shrink(np.array([[10.0, -3.0]]), prior=prior, sigma2=4.0, tau2=np.full(2, 0.5))
    _, ell_zero = shrink(np.array([[10.0, 0.0]]), prior=prior, sigma2=4.0, tau2=np.full(2, 0.5))
    assert ell_neg[0, 1] == ell_zero[0, 1]


def test_three_labels_one_against_the_rest_by_hand() -> None:
    # ĉ = (2, 3, 5), π = (.5, .3, .2), σ² = 1, τ² = (-, 0.5, 2): label 2 against 0 and 1:
    # a = 5 + .2, b = (2 + 3) + .8, the rest's noise variance 2σ²
    prior = np.array([0.5, 0.3, 0.2])
    p, ell = shrink(
        np.array([[2.0, 3.0, 5.0]]), prior=prior, sigma2=1.0, tau2=np.array([1.0, 0.5, 2.0])
    )
    v = (5.2 + 1) / 5.2**2 + (5.8 + 2) / 5.8**2
    want = logit(0.2) + 2 / (2 + v) * (math.log(5.2 / 5.8) - logit(0.2))
    assert ell[0, 2] == pytest.approx(want, rel=1e-12)
    v1 = (3.3 + 1) / 3.3**2 + (7.7 + 2) / 7.7**2
    want1 = logit(0.3) + 0.5 / (0.5 + v1) * (math.log(3.3 / 7.7) - logit(0.3))
    assert ell[0, 1] == pytest.approx(want1, rel=1e-12)
    assert p[0, 2] == pytest.approx(1 / (1 + math.exp(-want)), rel=1e-12)


@pytest.mark.parametrize("sigma2", [0.0, 30.0, 1e4])
def test_no_counts_give_the_prior_exactly(sigma2: float) -> None:
    prior = np.array([0.6, 0.3, 0.1])
    est = np.array([[0.0, 0.0, 0.0], [-5.0, -1.0, -2.0]])
    p, ell = shrink(est, prior=prior, sigma2=sigma2, tau2=np.full(3, 2.0))
    assert np.allclose(ell, np.log(prior / (1 - prior)), rtol=0, atol=1e-12)
    assert np.allclose(p, prior, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("sigma2", "share"), [(0.0, 0.9), (25.0, 0.9), (25.0, 0.02), (900.0, 0.5)])
def test_monotone_in_the_total(sigma2: float, share: float) -> None:
    """At a fixed label share, the shrunk log-odds move away from the prior's, monotonely,
    as the total grows (more data, less shrinkage), and stay between the prior's and ℓ̂."""
    prior = np.array([0.8, 0.2])
    totals = np.geomspace(0.01, 1e7, 400)
    est = np.column_stack([(1 - share) * totals, share * totals])
    tau2 = np.full(2, 0.7)
    _, ell = shrink(est, prior=prior, sigma2=sigma2, tau2=tau2)
    gap = np.abs(ell[:, 1] - logit(0.2))
    assert np.all(np.diff(gap) >= -1e-12)
    raw, _, _ = log_odds(est, prior, sigma2)
    assert np.all(gap <= np.abs(raw[:, 1] - logit(0.2)) + 1e-12)


def test_without_noise_a_growing_total_gives_the_keys_own_log_odds() -> None:
    prior = np.array([0.8, 0.2])
    for total in (1e4, 1e6, 1e8):
        est = np.array([[0.4 * total, 0.6 * total]])
        _, ell = shrink(est, prior=prior, sigma2=0.0, tau2=np.full(2, 0.3))
        raw, _, _ = log_odds(est, prior, 0.0)
        # 1 − weight = v/(τ² + v), v ≈ 4.2/total, times |ℓ̂ − ℓ_prior| ≈ 1.8: ≈ 25/total
        assert abs(ell[0, 1] - raw[0, 1]) < 40 / total
    assert ell[0, 1] == pytest.approx(logit(0.6), abs=1e-6)
    # with noise the same total keeps some shrinkage: the noise does not average away
    _, noisy = shrink(est, prior=prior, sigma2=1e16, tau2=np.full(2, 0.3))  # σ = the total
    assert abs(noisy[0, 1] - logit(0.2)) < abs(ell[0, 1] - logit(0.2)) - 0.1


def test_derived_columns_under_empirical_bayes_keep_the_flag_not_the_prior() -> None:
    prior = np.array([0.7, 0.3])
    est = np.array([[1.0, 2.0], [40.0, 2.0], [0.0, 0.0]])
    counts, total, p, logodds, backoff = derived_columns(
        est, prior=prior, alpha=1.0, threshold=5.0, sigma2=2.0, tau2=np.full(2, 0.4)
    )
    want_p, want_ell = shrink(est, prior=prior, sigma2=2.0, tau2=np.full(2, 0.4))
    assert np.array_equal(logodds, want_ell) and np.array_equal(p, want_p)
    assert backoff.tolist() == [1.0, 0.0, 1.0]
    assert p[0, 1] != prior[1]  # below the threshold, shrunk, not replaced by the prior
    assert total.tolist() == [3.0, 42.0, 0.0] and counts.tolist() == est.tolist()


@pytest.mark.parametrize("depth", [1, 2, 3, 4, 5, 8, 16])
def test_median_variance_factors(depth: int) -> None:
    """The variance of numpy's median (the mean of the two middle draws for even depth) of
    ``depth`` standard normal draws, by simulation: within 2 % of the table."""
    rng = np.random.default_rng(depth)
    draws = rng.standard_normal((400_000, depth))
    got = float(np.median(draws, axis=1).var())
    assert got == pytest.approx(MEDIAN_VARIANCE[depth - 1], rel=0.02)
    assert estimate_variance(noise_variance=2.0, n_windows=3, depth=depth) == pytest.approx(
        6.0 * MEDIAN_VARIANCE[depth - 1]
    )


def table_of_keys(
    rng: np.random.Generator,
    *,
    tau: float,
    prior1: float,
    n_keys: int,
    per_key: int,
    noise_sd: float,
    width: int = 1 << 14,
    depth: int = 3,
) -> np.ndarray:
    """A two-label count-sketch table ([label][row][bucket]) of ``n_keys`` keys, each with
    ``per_key`` observations whose log-odds are the prior's + N(0, tau²), plus rounded normal
    noise in every cell."""
    table = np.zeros((2, depth, width), dtype=np.int64)
    ell = logit(prior1) + tau * rng.standard_normal(n_keys)
    ones = rng.binomial(per_key, 1 / (1 + np.exp(-ell)))
    counts = np.stack([per_key - ones, ones])  # (2, keys)
    for i in range(depth):
        buckets = rng.integers(0, width, n_keys)
        signs = rng.choice([-1, 1], n_keys)
        for lab in range(2):
            np.add.at(table[lab, i], buckets, signs * counts[lab])
    table += np.rint(noise_sd * rng.standard_normal(table.shape)).astype(np.int64)
    return table


@pytest.mark.parametrize(("tau", "noise_sd"), [(0.8, 0.0), (0.8, 3.0), (0.4, 0.0)])
def test_between_variance_recovers_the_spread_of_the_keys(tau: float, noise_sd: float) -> None:
    rng = np.random.default_rng(7)
    table = table_of_keys(rng, tau=tau, prior1=0.2, n_keys=600, per_key=400, noise_sd=noise_sd)
    prior = np.array([0.8, 0.2])
    tau2 = between_variance(table, prior=prior, cell_variance=noise_sd**2)
    assert tau2.shape == (2,)
    # within 25 % (collisions of same-sign keys average them: a little low at most)
    assert tau2[1] == pytest.approx(tau**2, rel=0.25)
    assert tau2[0] == pytest.approx(tau2[1])  # two labels: the same contrast, negated


def test_between_variance_of_keys_that_share_the_prior_is_small() -> None:
    rng = np.random.default_rng(8)
    table = table_of_keys(rng, tau=0.0, prior1=0.3, n_keys=600, per_key=400, noise_sd=2.0)
    tau2 = between_variance(table, prior=np.array([0.7, 0.3]), cell_variance=4.0)
    assert tau2[1] < 0.01


def test_between_variance_of_noise_alone_is_zero() -> None:
    """A table holding nothing but noise: no cell passes the total's threshold (6σ over the
    labels) but by chance, so τ² is 0 or tiny: every key is shrunk to the prior."""
    rng = np.random.default_rng(9)
    table = np.rint(20.0 * rng.standard_normal((2, 3, 1 << 14))).astype(np.int64)
    tau2 = between_variance(table, prior=np.array([0.5, 0.5]), cell_variance=400.0)
    assert tau2[1] < 0.05
    assert between_variance(
        np.zeros((2, 3, 64), np.int64), prior=np.array([0.5, 0.5]), cell_variance=0.0
    ).tolist() == [0.0, 0.0]


# -- the featurizer ---------------------------------------------------------------------------


def runtime(featurize: dict[str, object], mechanism: str = "laplace") -> StreamRuntime:
    privacy: dict[str, object] = {"mechanism": mechanism}
    if mechanism == "laplace":
        privacy["epsilon"] = 1.0
    cfg = StreamCreate.model_validate(
        {
            "name": "s",
            "features": [
                {"name": "user", "kind": "categorical"},
                {"name": "item", "kind": "categorical"},
            ],
            "labels": ["0", "1", "2"],
            "privacy": privacy,
            "sketch": {"width": 256, "depth": 3},
            "featurize": featurize,
        }
    )
    tables = (
        TableRef(1, "user", ("user",), 1),
        TableRef(2, "item", ("item",), 1),
        TableRef(3, "user+item", ("user", "item"), 1),
    )
    return StreamRuntime(id=1, name="s", config=cfg, hash_seed=SEED, tables=tables)


def aggregate(rt: StreamRuntime, rng: np.random.Generator, n_windows: int = 3) -> Aggregate:
    """Tables with a few heavy keys' counts over noise (as a count period's sum would hold)."""
    spec = rt.spec
    parts = []
    for t in rt.tables:
        cells = rng.integers(-15, 16, spec.cells).astype(np.int64).reshape(spec.shape)
        for k in range(40):
            key = f"v{k}".encode() if len(t.features) == 1 else f"v{k}\x1fv{k}".encode()
            b, s = hash_keys([key], seed=SEED, table=t.name, spec=spec)
            counts = rng.integers(0, 300, spec.n_labels)
            for i in range(spec.depth):
                cells[:, i, b[0, i]] += s[0, i] * counts
        parts.append(cells.reshape(-1))
    prior = np.array([500, 300, 200], dtype=np.int64)
    layout = [(t.id, spec.cells) for t in rt.tables]
    return Aggregate(
        9, 1, 3, list(range(1, n_windows + 1)), layout, np.concatenate(parts + [prior])
    )


def rows(n: int, rng: np.random.Generator) -> list[dict[str, object]]:
    pool = [f"v{k}" for k in range(50)] + [None]
    return [
        {"user": pool[int(rng.integers(0, len(pool)))], "item": pool[int(rng.integers(0, 51))]}
        for _ in range(n)
    ]


def by_hand(fz: Featurizer, rows_: Sequence[dict[str, object]]) -> np.ndarray:
    """Each table's block recomputed from the noisy aggregate alone: the key's estimate from
    its cells, the prior from the prior table, σ² from the noise settings, τ² from the
    table's cells (``between_variance``)."""
    rt, spec = fz.rt, fz.rt.spec
    out = []
    for j, t in enumerate(rt.tables):
        cells = fz.agg.tables[t.id]
        keys = []
        for r in rows_:
            parts = [b"\x00" if r[f] is None else str(r[f]).encode() for f in t.features]
            keys.append(b"\x1f".join(parts))
        b, s = hash_keys(keys, seed=SEED, table=t.name, spec=spec)
        est = estimate(cells, b, s, spec)
        cell_var = rt.noise.variance_for(1.0) * fz.agg.n_windows
        sigma2 = cell_var * MEDIAN_VARIANCE[spec.depth - 1]
        tau2 = between_variance(cells.reshape(spec.shape), prior=fz.prior, cell_variance=cell_var)
        counts, total, p, logodds, backoff = derived_columns(
            est,
            prior=fz.prior,
            alpha=1.0,
            threshold=float(fz.thresholds[j]),
            sigma2=sigma2,
            tau2=tau2,
        )
        out.append(np.hstack([counts, total[:, None], p[:, 1:], logodds[:, 1:], backoff[:, None]]))
    return np.hstack(out)


@pytest.mark.parametrize("n", [1, 5, 8, 9, 300])  # the few-rows path and the batch path
def test_featurizer_serves_the_shrunk_columns_of_the_noisy_aggregate(n: int) -> None:
    rng = np.random.default_rng(n)
    rt = runtime({"shrinkage": "empirical_bayes"})
    fz = Featurizer.build(rt, aggregate(rt, rng))
    assert fz.tau2s is not None and fz.tau2s.shape == (3, 3) and (fz.tau2s[:, 1:] > 0).all()
    rs = rows(n, rng)
    got = fz.transform(rs)
    np.testing.assert_allclose(got, by_hand(fz, rs), rtol=1e-12, atol=1e-12)
    again = fz.transform(rs)  # the few-rows path's cached blocks
    np.testing.assert_allclose(again, got, rtol=1e-12, atol=1e-12)


def test_pseudo_count_is_the_default_and_unchanged() -> None:
    rng = np.random.default_rng(3)
    rt = runtime({})
    assert rt.config.featurize.shrinkage == "pseudo_count"
    agg = aggregate(rt, rng)
    fz = Featurizer.build(rt, agg)
    assert fz.tau2s is None and fz.sigma2s is None
    eb = Featurizer.build(runtime({"shrinkage": "empirical_bayes"}), agg)
    rs = rows(50, rng)
    a, b = fz.transform(rs), eb.transform(rs)
    assert a.shape == b.shape and fz.columns == eb.columns
    counts = [j for j, c in enumerate(fz.columns) if ":count:" in c or c.endswith(":total")]
    assert np.array_equal(a[:, counts], b[:, counts])
    assert not np.allclose(a, b)


def test_a_set_between_variance_is_used_for_every_table() -> None:
    rng = np.random.default_rng(4)
    rt = runtime({"shrinkage": "empirical_bayes", "eb_variance": 0.25})
    fz = Featurizer.build(rt, aggregate(rt, rng))
    assert fz.tau2s is not None and np.all(fz.tau2s == 0.25)
    zero = Featurizer.build(runtime({"shrinkage": "empirical_bayes", "eb_variance": 0}), fz.agg)
    rs = rows(20, rng)
    prior_logodds = np.log(zero.prior / (1 - zero.prior))[1:]
    j = zero.columns.index("user:logodds:1")
    np.testing.assert_allclose(zero.transform(rs)[:, j : j + 2], np.tile(prior_logodds, (20, 1)))


def test_rebuilding_on_the_same_aggregate_reuses_the_estimate() -> None:
    rng = np.random.default_rng(5)
    rt = runtime({"shrinkage": "empirical_bayes"})
    fz = Featurizer.build(rt, aggregate(rt, rng))
    again = Featurizer.build(rt, fz.agg, previous=fz)
    assert again.tau2s is fz.tau2s
    other = Featurizer.build(rt, aggregate(rt, rng), previous=fz)
    assert other.tau2s is not fz.tau2s


def test_without_noise_sigma_is_zero() -> None:
    rng = np.random.default_rng(6)
    rt = runtime({"shrinkage": "empirical_bayes"}, mechanism="none")
    fz = Featurizer.build(rt, aggregate(rt, rng))
    assert fz.sigma2s is not None and np.all(fz.sigma2s == 0.0)


def test_a_few_valued_table_under_heavy_tailed_noise() -> None:
    """Two heavy values of nearly the prior's log-odds (MovieLens' gender) in a wide table of
    summed Laplace noise (four windows, b = 15): the cells of noise alone that pass the
    threshold must not set τ² (cells kept from 4 σ, more of noise alone than real ones, gave
    0.32 here)."""
    rng = np.random.default_rng(11)
    width, depth, b, windows = 1 << 14, 3, 15.0, 4
    table = np.zeros((2, depth, width), dtype=np.int64)
    for counts in ((20_250, 25_300), (5_800, 8_700)):  # label 0, label 1
        for i in range(depth):
            bucket, sign = int(rng.integers(0, width)), int(rng.choice([-1, 1]))
            table[:, i, bucket] += sign * np.array(counts)
    table += np.rint(rng.laplace(0.0, b, (windows, *table.shape)).sum(axis=0)).astype(np.int64)
    prior = np.array([26_050, 34_000]) / 60_050
    tau2 = between_variance(table, prior=prior, cell_variance=2 * b * b * windows)
    assert tau2[1] < 0.05
