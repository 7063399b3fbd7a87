"""Slots for selected groups cost nothing unless selection can fill them
(``service.core.dp.budget``, "Slots for selected groups"): with selection off a stream's noise
is calibrated to its features' tables and the prior table (T = features + 1), with selection on
4 slots are reserved and split as before, a new stream asking for slots nothing can fill is
refused, and a stored configuration keeps the ``max_tables``, and so the noise, it was created
with."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import update

from service.core.dp.budget import budget_split, noise_for, slot_cost, unused_slots
from service.core.streamconfig import StreamCreate
from service.db.models import Stream
from service.streams import service as streams
from tests.conftest import Api, unique
from tests.helpers import stream_body

FEATURES, DEPTH = 3, 3  # stream_body: user, item, age; sketch depth 3
BUDGETS = {"laplace": {"epsilon": 2.0}, "gaussian": {"rho": 0.5}}


def _scale(mechanism: str, tables: int) -> float:
    """The uniform per-table scale at T = ``tables`` (k = 1, no user key): Laplace b = T·depth/ε,
    Gaussian σ = sqrt(T·depth)/sqrt(2ρ)."""
    if mechanism == "laplace":
        return tables * DEPTH / BUDGETS["laplace"]["epsilon"]
    return math.sqrt(tables * DEPTH) / math.sqrt(2 * BUDGETS["gaussian"]["rho"])


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
async def test_selection_off_calibrates_the_noise_to_the_tables_that_exist(
    api: Api, mechanism: str
) -> None:
    """A stream created with the defaults and selection off: T = features + 1, so every
    table's scale is that of T = 4 (Laplace 6 at ε = 2, σ = sqrt(12) at ρ = 0.5), not of the
    old default's 4 unused slots (T = 8: 12 and sqrt(24))."""
    name = unique("slots")
    body = stream_body(name, privacy={"mechanism": mechanism, **BUDGETS[mechanism]})
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == 201, r.text
    s = r.json()
    assert s["max_tables"] == FEATURES + 1
    expected = _scale(mechanism, FEATURES + 1)
    assert s["noise_scale"] == pytest.approx(expected)
    assert s["noise_scale"] < _scale(mechanism, FEATURES + 5) / 1.4  # the old default's
    rows = {row["table"]: row for row in s["budget"]}
    assert set(rows) == {"user", "item", "age", "(prior)"}  # no slot for selected groups
    assert sum(row["share"] for row in rows.values()) == pytest.approx(1.0)
    for row in rows.values():
        assert row["noise_scale"] == pytest.approx(expected)
    # what prepares the windows' noise, and what the ledger reports, say the same
    rt = await streams.runtime(ctx=api.ctx, name=name)
    assert rt.noise.scale_for(1.0) == pytest.approx(expected)
    led = await api.get(f"/v1/streams/{name}/privacy", role="analyst")
    assert led.status_code == 200, led.text
    params = led.json()["observation"]["parts"][0]["parameters"]
    assert params["max_tables"] == FEATURES + 1
    assert params["noise_scale"] == pytest.approx(expected)


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
async def test_selection_on_reserves_four_slots_in_the_split(api: Api, mechanism: str) -> None:
    """With selection on the default reserves 4 slots (T = features + 5), each at weight 1:
    share 1/8 each, and every table's scale is that of T = 8."""
    privacy = {"mechanism": mechanism, **BUDGETS[mechanism], "epsilon_selection": 0.1}
    r = await api.post("/v1/streams", json=stream_body(unique("slots"), privacy=privacy))
    assert r.status_code == 201, r.text
    s = r.json()
    assert s["max_tables"] == FEATURES + 1 + 4
    expected = _scale(mechanism, FEATURES + 5)
    assert s["noise_scale"] == pytest.approx(expected)
    rows = {row["table"]: row for row in s["budget"]}
    slots = rows["(selected groups)"]
    assert slots["slots"] == 4 and slots["share"] == pytest.approx(1 / 8)
    assert all(row["noise_scale"] == pytest.approx(expected) for row in rows.values())
    assert sum(row["share"] * row["slots"] for row in rows.values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("over", "status"),
    [
        ({"max_tables": FEATURES + 2}, 422),
        ({"max_tables": FEATURES + 5}, 422),
        ({"max_tables": FEATURES + 5, "privacy": {"mechanism": "none"}}, 422),
        ({"max_tables": FEATURES + 1}, 201),
        ({"max_tables": FEATURES + 2, "privacy": {"epsilon_selection": 0.1}}, 201),
    ],
)
async def test_slots_nothing_can_fill_are_refused_naming_the_field(
    api: Api, over: dict, status: int
) -> None:
    body = stream_body(unique("slots"), **({"privacy": {"epsilon": 1.0}} | over))
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == status, r.text
    if status == 422:
        detail = r.json()["detail"]
        assert detail.startswith(f"max_tables: {over['max_tables']} is more than")
        assert "epsilon_selection is 0" in detail and f"set it to {FEATURES + 1}" in detail


def test_the_refusal_states_the_cost() -> None:
    cfg = StreamCreate.model_validate(stream_body("s", max_tables=8, privacy={"epsilon": 1.0}))
    msg = unused_slots(cfg)
    assert msg is not None
    assert "4 extra slots" in msg and "50% of the per-window budget" in msg and "×2 " in msg
    cost = slot_cost(4.0, 4)
    assert cost == pytest.approx({"share": 1 / 8, "laplace": 2.0, "gaussian": math.sqrt(2)})


def _old_default(mechanism: str) -> dict:
    """The configuration a stream created with the defaults and selection off was stored with
    before: ``max_tables`` = features + 1 + 4, the free slots as its selection rounds."""
    cfg = StreamCreate.model_validate(
        stream_body("s", privacy={"mechanism": mechanism, **BUDGETS[mechanism]})
    ).model_dump(mode="json")
    cfg["max_tables"] = FEATURES + 5
    cfg["privacy"]["selection_rounds"] = 4
    return cfg


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_a_stored_configuration_keeps_its_max_tables_and_noise(mechanism: str) -> None:
    cfg = StreamCreate.model_validate(_old_default(mechanism))
    assert cfg.max_tables == FEATURES + 5 and unused_slots(cfg) is not None
    assert noise_for(cfg).scale == pytest.approx(_scale(mechanism, FEATURES + 5))
    rows = {row["table"]: row for row in budget_split(cfg)}
    assert rows["(selected groups)"]["slots"] == 4


async def test_a_stream_stored_before_keeps_its_noise_in_the_service(api: Api) -> None:
    """A stream whose stored configuration has the old default is read, served and noised with
    its own ``max_tables``: the new default and the refusal apply to new streams only."""
    name = unique("slots")
    body = stream_body(name, privacy={"mechanism": "laplace", **BUDGETS["laplace"]})
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    stored = _old_default("laplace") | {"name": name}
    async with api.ctx.sessionmaker() as session, session.begin():
        await session.execute(update(Stream).where(Stream.name == name).values(config=stored))
    old = _scale("laplace", FEATURES + 5)
    r = await api.get(f"/v1/streams/{name}")
    assert r.status_code == 200, r.text
    assert r.json()["max_tables"] == FEATURES + 5
    assert r.json()["noise_scale"] == pytest.approx(old)
    async with api.ctx.sessionmaker() as session:
        stream = await streams.get(session=session, name=name)
        rt = streams.runtime_of(stream, [])
    assert rt.noise.scale_for(1.0) == pytest.approx(old)  # what the next window is drawn with
    led = await api.get(f"/v1/streams/{name}/privacy", role="analyst")
    assert led.status_code == 200, led.text
    assert led.json()["observation"]["parts"][0]["parameters"]["noise_scale"] == (
        pytest.approx(old)
    )
