"""The ledger's numbers, recomputed from first principles (DESIGN §4, §6)."""

from __future__ import annotations

import math

import pytest
from scipy import optimize

from tests.conftest import Api, unique
from tests.helpers import stream_body


def cks_eps(rho: float, delta: float) -> float:
    """CKS 2020 Cor 13, minimised independently with scipy."""

    def f(a: float) -> float:
        return a * rho + (math.log(1 / delta) + (a - 1) * math.log(1 - 1 / a) - math.log(a)) / (
            a - 1
        )

    res = optimize.minimize_scalar(
        f, bounds=(1.0001, 1e6), method="bounded", options={"xatol": 1e-10}
    )
    return max(0.0, float(res.fun))


async def _ledger(api: Api, **over: object) -> dict:
    name = unique("led")
    r = await api.post("/v1/streams", json=stream_body(name, **over))
    assert r.status_code == 201, r.text
    r = await api.get(f"/v1/streams/{name}/privacy", role="analyst")
    assert r.status_code == 200, r.text
    return r.json()


async def test_laplace_per_observation_and_per_user(api: Api) -> None:
    # 3 features + prior, max_tables default 3 + 1 + 4 = 8, depth 3: Δ1 = 24
    led = await _ledger(
        api,
        hot_windows=2,
        retention_windows=5,
        privacy={
            "mechanism": "laplace",
            "epsilon": 0.5,
            "epsilon_selection": 0.1,
            "user_key": "user",
            "max_contributions_per_window": 3,
        },
    )
    obs = led["observation"]
    tables, selection = obs["parts"]
    assert tables["parameters"]["l1_sensitivity"] == 3 * 8 * 3  # c · T · depth
    assert tables["parameters"]["noise_scale"] == pytest.approx(72 / 0.5)
    assert tables["epsilon"] == pytest.approx(0.5)  # disjoint windows: one window's ε
    assert selection["epsilon"] == pytest.approx(2 * 0.1)  # H rounds
    assert obs["epsilon"] == pytest.approx(0.5 + 0.2) and obs["delta"] == 0
    user = led["user"]
    assert user["parts"][0]["epsilon"] == pytest.approx((5 + 2) * 0.5)  # R + H windows
    # selection: R + H rounds, each with group privacy over c · H counted observations
    assert user["parts"][1]["epsilon"] == pytest.approx((5 + 2) * 0.1 * 3 * 2)
    assert user["epsilon"] == pytest.approx(3.5 + 4.2)


async def test_gaussian_per_observation_and_per_user(api: Api) -> None:
    led = await _ledger(
        api,
        hot_windows=1,
        retention_windows=4,
        privacy={
            "mechanism": "gaussian",
            "rho": 0.2,
            "delta": 1e-8,
            "user_key": "user",
            "max_contributions_per_window": 2,
        },
    )
    obs = led["observation"]
    (tables,) = obs["parts"]
    assert tables["parameters"]["l2_sensitivity"] == pytest.approx(2 * math.sqrt(8 * 3))
    assert tables["parameters"]["noise_scale"] == pytest.approx(2 * math.sqrt(24) / math.sqrt(0.4))
    assert tables["rho"] == pytest.approx(0.2)
    assert obs["epsilon"] == pytest.approx(cks_eps(0.2, 1e-8), rel=1e-4)
    assert obs["epsilon"] <= 0.2 + 2 * math.sqrt(0.2 * math.log(1e8))  # Bun-Steinke bound
    assert obs["delta"] == 1e-8
    user = led["user"]
    assert user["rho"] == pytest.approx(5 * 0.2)
    assert user["epsilon"] == pytest.approx(cks_eps(1.0, 1e-8), rel=1e-4)


async def test_without_user_key_and_without_noise(api: Api) -> None:
    led = await _ledger(api, privacy={"mechanism": "laplace", "epsilon": 2.0})
    assert led["user"] is None
    assert led["observation"]["epsilon"] == pytest.approx(2.0)
    assert len(led["observation"]["parts"]) == 1  # no selection budget, no selection part
    none = await _ledger(api, privacy={"mechanism": "none"})
    assert none["observation"]["epsilon"] is None  # no guarantee
