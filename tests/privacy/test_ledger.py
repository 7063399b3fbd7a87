"""The ledger's numbers, recomputed from first principles (docs/ARCHITECTURE.md, "Privacy",
"Privacy ledger")."""

from __future__ import annotations

import math

import pytest
from scipy import optimize

from tests.conftest import Api, unique
from tests.helpers import new_stream, stream_body


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
    name = await new_stream(api, "led", **over)
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
    assert tables["parameters"]["l1_sensitivity"] == 3 * 8 * 3  # max(c, 2) · T · depth
    assert tables["parameters"]["noise_scale"] == pytest.approx(72 / 0.5)
    # disjoint windows: one window's; one observation changes 2 counted ones (a swap) of the
    # 3 the noise is calibrated to
    assert tables["epsilon"] == pytest.approx(0.5 * 2 / 3)
    # H rounds (4 free slots >= H), each two records of the round (a swap): group privacy 2
    assert selection["epsilon"] == pytest.approx(2 * 0.1 * 2)
    assert obs["epsilon"] == pytest.approx(0.5 * 2 / 3 + 0.4) and obs["delta"] == 0
    user = led["user"]
    assert user["parts"][0]["epsilon"] == pytest.approx((5 + 2) * 0.5)  # R + H windows
    # selection: a stream releases at most its 8 - 3 - 1 = 4 free slots' rounds (each commits a
    # table), a user may be in all of them, each with group privacy over c · H counted
    # observations (issue 12, item 8: not R + H rounds)
    assert user["parts"][1]["parameters"]["rounds"] == 4
    assert user["parts"][1]["epsilon"] == pytest.approx(4 * 0.1 * 3 * 2)
    assert user["epsilon"] == pytest.approx(3.5 + 2.4)


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
    # selection off: T = 3 features + prior = 4, depth 3
    assert tables["parameters"]["l2_sensitivity"] == pytest.approx(2 * math.sqrt(4 * 3))
    assert tables["parameters"]["noise_scale"] == pytest.approx(2 * math.sqrt(12) / math.sqrt(0.4))
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


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
async def test_a_weighted_budget_split_is_recomputed_and_sums_to_the_budget(
    api: Api, mechanism: str
) -> None:
    """``table_weights``: table s gets the share w_s/W of the window's budget, W over all
    max_tables slots (features' tables, the prior, the free slots at weight 1: selection is on
    here, so 4 are reserved); its noise is the mechanism's for one table (L1 c·depth, L2
    c·sqrt(depth)) at that share. The shares add up to the stream's ε (ρ), which the ledger
    still reports per window."""
    budget = {"epsilon": 2.0} if mechanism == "laplace" else {"rho": 0.8}
    privacy = {
        "mechanism": mechanism,
        **budget,
        "table_weights": {"item": 6.0, "age": 0.25},
        "prior_weight": 0.5,
        "user_key": "user",
        "max_contributions_per_window": 2,
        "epsilon_selection": 0.1,
    }
    led = await _ledger(api, privacy=privacy)
    params = led["observation"]["parts"][0]["parameters"]
    c, depth = 2, 3  # max_tables 8: 3 features + prior + 4 free slots (stream_body: depth 3)
    weights = {"user": 1.0, "item": 6.0, "age": 0.25, "(prior)": 0.5}
    total = sum(weights.values()) + 4 * 1.0
    rows = {row["table"]: row for row in params["budget_split"]}
    assert set(rows) == {*weights, "(selected groups)"} and rows["(selected groups)"]["slots"] == 4
    weights["(selected groups)"] = 1.0
    whole = budget["epsilon" if mechanism == "laplace" else "rho"]
    spent = 0.0
    for name, w in weights.items():
        part = whole * w / total
        row = rows[name]
        assert row["share"] == pytest.approx(w / total)
        if mechanism == "laplace":
            assert row["epsilon"] == pytest.approx(part)
            assert row["noise_scale"] == pytest.approx(c * depth / part)  # b_s = Δ1(table)/ε_s
        else:
            assert row["rho"] == pytest.approx(part)
            assert row["noise_scale"] == pytest.approx(c * math.sqrt(depth) / math.sqrt(2 * part))
        spent += part * row["slots"]
    assert spent == pytest.approx(whole)
    assert any("budget_split" in note for note in led["notes"])
    assert led["observation"]["parts"][0]["epsilon" if mechanism == "laplace" else "rho"] == (
        pytest.approx(whole)
    )
    # all weights 1: the uniform noise (docs/ARCHITECTURE.md, "Privacy"), b = Δ1/ε (σ = Δ2/sqrt(2ρ))
    uniform = await _ledger(api, privacy={"mechanism": mechanism, **budget})
    u_params = uniform["observation"]["parts"][0]["parameters"]
    for row in u_params["budget_split"]:
        assert row["noise_scale"] == pytest.approx(u_params["noise_scale"])


async def test_table_weights_are_checked(api: Api) -> None:
    for privacy, field in (
        ({"table_weights": {"nope": 2.0}}, "table_weights"),
        ({"table_weights": {"item": 0}}, "table_weights"),
        ({"prior_weight": 5000}, "prior_weight"),
    ):
        r = await api.post("/v1/streams", json=stream_body(unique("tw"), privacy=privacy))
        assert r.status_code == 422 and field in r.text, r.text


async def test_selection_is_charged_for_the_rounds_a_stream_can_release(api: Api) -> None:
    """Issue 12, item 8: rounds run until the free slots are used and each releasing round
    commits a table, so S = max_tables − features − 1 rounds at most: min(H, S) per
    observation (H rounds read it), S per user (a user may be in all), whatever R is."""
    privacy = {
        "mechanism": "laplace",
        "epsilon": 1.0,
        "epsilon_selection": 0.25,
        "user_key": "user",
        "max_contributions_per_window": 2,
        "min_records": 5000,
    }
    # 3 features + prior + 2 free slots; H = 3 > S = 2
    led = await _ledger(api, hot_windows=3, retention_windows=40, max_tables=6, privacy=privacy)
    obs_sel = led["observation"]["parts"][1]
    assert obs_sel["name"] == "table_selection"
    assert obs_sel["parameters"]["rounds"] == 2  # min(H = 3, S = 2)
    assert obs_sel["parameters"]["free_slots"] == 2
    assert obs_sel["parameters"]["min_records"] == 5000
    assert obs_sel["parameters"]["score"] == "aic"  # the default for new streams
    assert obs_sel["epsilon"] == pytest.approx(2 * 0.25 * 2)  # user-keyed: a swap, group 2
    user_sel = led["user"]["parts"][1]
    assert user_sel["parameters"]["rounds"] == 2 and user_sel["parameters"]["group_size"] == 6
    assert user_sel["epsilon"] == pytest.approx(2 * 0.25 * 2 * 3)  # S rounds, group c · H
    assert led["user"]["epsilon"] == pytest.approx((40 + 3) * 1.0 + 3.0)
    assert any("at most 2 rounds" in note for note in led["notes"])
    # no free slot: no round can run, nothing is charged for selection
    full = await _ledger(api, max_tables=4, privacy=privacy)
    assert [p["name"] for p in full["observation"]["parts"]] == ["count_tables"]
    assert [p["name"] for p in full["user"]["parts"]] == ["count_tables"]


async def test_min_records_is_checked_and_defaults_to_a_hundred_thousand(api: Api) -> None:
    led = await _ledger(api, privacy={"epsilon_selection": 0.5})
    assert led["observation"]["parts"][1]["parameters"]["min_records"] == 100_000
    for value in (0, -3, 2_000_000_000, 1.5):
        body = stream_body(unique("mr"), privacy={"epsilon_selection": 0.5, "min_records": value})
        r = await api.post("/v1/streams", json=body)
        assert r.status_code == 422 and "min_records" in r.text, r.text
