"""The noise in a window's tables: the right mechanism and scale, from the CSPRNG only."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from scipy import stats

from service.core.dp.noise import discrete_gaussian_pmf, discrete_laplace_pmf
from service.streams import service as streams
from service.windows import service as windows
from tests.conftest import Api, unique
from tests.helpers import stream_body


def _chi_square_p(samples: np.ndarray, pmf) -> float:  # type: ignore[no-untyped-def]
    """Chi-square goodness of fit against an exact pmf symmetric about 0: one bin per value
    in [-m, m] where the expected count is at least 5, the two tails pooled."""
    n = samples.size
    m = 0
    while pmf(np.array([m + 1]))[0] * n >= 5:
        m += 1
    inner = np.arange(-m, m + 1)
    exp_inner = pmf(inner) * n
    tail = (n - exp_inner.sum()) / 2
    observed = np.concatenate(
        [
            [np.sum(samples < -m)],
            np.bincount(samples[np.abs(samples) <= m] + m, minlength=2 * m + 1),
            [np.sum(samples > m)],
        ]
    ).astype(float)
    expected = np.concatenate([[tail], exp_inner, [tail]])
    return float(stats.chisquare(observed, expected * n / expected.sum()).pvalue)


async def _fresh_tables(api: Api, privacy: dict) -> tuple[dict[str, np.ndarray], dict]:
    """A new stream's window 2 (prepared ahead of time, never written to): each table's cells
    by name, and the stream as the API returned it."""
    name = unique("noise")
    body = stream_body(name, privacy=privacy, sketch={"width": 2048, "depth": 3})
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == 201, r.text
    rt = await streams.runtime(ctx=api.ctx, name=name)
    data = await api.ctx.stores.windows.read_tables(
        rt.name, 2, [t.id for t in rt.tables], cells=rt.spec.cells
    )
    assert data is not None
    return {t.name: data[0][t.id] for t in rt.tables}, r.json()


async def _fresh_cells(api: Api, privacy: dict) -> tuple[np.ndarray, float]:
    tables, stream = await _fresh_tables(api, privacy)
    return np.concatenate(list(tables.values())), stream["noise_scale"]


async def test_fresh_laplace_cells_follow_the_exact_pmf_at_scale_delta_over_epsilon(
    api: Api,
) -> None:
    cells, scale = await _fresh_cells(api, {"mechanism": "laplace", "epsilon": 2.0})
    # Δ1 = T·depth = (3 features + prior) · 3 = 12 (selection off: no slot); b = Δ1/ε = 6
    assert scale == pytest.approx(6.0)
    assert cells.size == 3 * 2 * 3 * 2048
    # false-failure rate of this check: 1e-6 (the noise is fresh CSPRNG output each run)
    assert _chi_square_p(cells, lambda x: discrete_laplace_pmf(x, scale=scale)) > 1e-6
    # and not some other scale: b = 4 or 9, or 12 (4 unused slots, T = 8), must be rejected
    for wrong in (4.0, 9.0, 12.0):
        assert _chi_square_p(cells, lambda x, w=wrong: discrete_laplace_pmf(x, scale=w)) < 1e-6


async def test_fresh_gaussian_cells_follow_the_exact_pmf(api: Api) -> None:
    cells, sigma = await _fresh_cells(api, {"mechanism": "gaussian", "rho": 0.5})
    # Δ2 = sqrt(T·depth) = sqrt(12); σ = Δ2/sqrt(2ρ) = sqrt(12) (sqrt(24) with 4 unused slots)
    assert sigma == pytest.approx(np.sqrt(12.0))
    assert _chi_square_p(cells, lambda x: discrete_gaussian_pmf(x, sigma=sigma)) > 1e-6
    assert _chi_square_p(cells, lambda x: discrete_gaussian_pmf(x, sigma=sigma * 1.3)) < 1e-6


async def test_weighted_tables_get_the_noise_of_their_share_of_the_budget(api: Api) -> None:
    """With ``table_weights``, each table's fresh cells follow the exact pmf at its own scale,
    b_s = depth/ε_s with ε_s = ε·w_s/W (W over the 4 slots: user 1, item 6, age 0.5, the prior
    1: W = 8.5), and not at the uniform scale Δ1/ε."""
    privacy = {"mechanism": "laplace", "epsilon": 2.0, "table_weights": {"item": 6, "age": 0.5}}
    tables, stream = await _fresh_tables(api, privacy)
    uniform = 12 / 2.0  # Δ1/ε
    assert set(tables) == {"user", "item", "age"}
    for name, cells in tables.items():
        w = {"user": 1.0, "item": 6.0, "age": 0.5}[name]
        scale = 3 / (2.0 * w / 8.5)  # depth / ε_s
        # false-failure rate of each check: 1e-6 (fresh CSPRNG output each run)
        assert _chi_square_p(cells, lambda x, b=scale: discrete_laplace_pmf(x, scale=b)) > 1e-6
        assert _chi_square_p(cells, lambda x: discrete_laplace_pmf(x, scale=uniform)) < 1e-6
    by_name = {row["table"]: row for row in stream["budget"]}
    assert by_name["item"]["noise_scale"] == pytest.approx(3 / (2.0 * 6 / 8.5))


def test_window_noise_uses_the_os_csprng_and_no_seeded_prng(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = {"n": 0}
    real = os.urandom

    def counting(n: int) -> bytes:
        calls["n"] += 1
        return real(n)

    def forbidden(*_a: object, **_k: object) -> None:
        raise AssertionError("a seeded / non-cryptographic PRNG was used for noise")

    monkeypatch.setattr(os, "urandom", counting)
    for target, attr in [
        (np.random, "default_rng"),
        (np.random, "seed"),
        (np.random, "RandomState"),
        (np.random, "Generator"),
        (np.random, "randint"),
        (np.random, "laplace"),
        (random, "Random"),
        (random, "seed"),
        (random, "random"),
    ]:
        monkeypatch.setattr(target, attr, forbidden)
    for mechanism in ("laplace", "gaussian"):
        tables, prior = windows.noise_tables(mechanism, [7.5, 7.5], 7.5, [1, 2], 4096, 2)
        assert tables[1].size == 4096 and prior.size == 2
        assert not np.array_equal(tables[1], tables[2])
        assert np.count_nonzero(tables[1]) > 3000
    assert calls["n"] > 0


async def test_two_windows_never_share_noise(api: Api) -> None:
    name = unique("fresh")
    r = await api.post(
        "/v1/streams", json=stream_body(name, privacy={"mechanism": "laplace", "epsilon": 1.0})
    )
    assert r.status_code == 201
    rt = await streams.runtime(ctx=api.ctx, name=name)
    store = api.ctx.stores.windows
    ids = [t.id for t in rt.tables]
    one, two = (
        await store.read_tables(rt.name, 1, ids, cells=rt.spec.cells),
        await store.read_tables(rt.name, 2, ids, cells=rt.spec.cells),
    )
    assert one is not None and two is not None
    assert np.mean(one[0][ids[0]] == two[0][ids[0]]) < 0.2
