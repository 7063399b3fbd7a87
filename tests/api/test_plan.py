"""``POST /v1/privacy/plan``: any key gets the proposal of ``service.core.dp.plan`` (the same as
the CLI's), whose ``stream`` body the service accepts and splits as planned; bad input is a
422 naming the field; no key is a 401."""

from __future__ import annotations

import pytest

from service.core.dp.plan import MAX_CELLS, PlanRequest, make_plan
from service.core.streamconfig import StreamCreate
from tests.conftest import Api, unique
from tests.helpers import stream_body

BODY = {
    "observations_per_window": 5000,
    "cardinalities": {"user": 5000, "item": 1700},
    "target_loss": 1.03,
}


async def test_any_key_gets_the_plan_and_the_service_takes_it(api: Api) -> None:
    r = await api.post("/v1/privacy/plan", "analyst", json=BODY)
    assert r.status_code == 200, r.text
    out = r.json()
    expected = make_plan(PlanRequest.model_validate(BODY))
    assert out["feasible"] and out["epsilon"] == expected.epsilon
    assert out["window_seconds"] == expected.window_seconds and out["width"] == expected.width
    assert [t["table"] for t in out["tables"]] == ["user", "item", "(prior)"]
    assert out["predicted_loss"] <= 1.03 + 1e-9 and any("rule:" in w for w in out["why"])
    stream = out["stream"] | {"name": unique("planned")}
    created = await api.post("/v1/streams", json=stream)
    assert created.status_code == 201, created.text
    split = await api.get(f"/v1/streams/{stream['name']}/privacy")
    assert split.status_code == 200, split.text
    planned = {t["table"]: t["epsilon"] for t in out["tables"]}
    served = {r["table"]: r["epsilon"] for r in _find(split.json(), "budget_split")}
    assert served == pytest.approx(planned, rel=1e-6)  # the service splits ε as planned
    assert sum(planned.values()) == pytest.approx(out["epsilon"])


async def test_a_plan_with_selection_reserves_slots_the_service_splits_as_planned(
    api: Api,
) -> None:
    """Without selection the plan's stream has no slot; with ``epsilon_selection`` it has 4 at
    the planned share, and the service gives every table and slot the ε the plan computed."""
    plain = (await api.post("/v1/privacy/plan", "analyst", json=BODY)).json()
    assert plain["selection_slots"] == 0 and plain["stream"]["max_tables"] == 3
    r = await api.post("/v1/privacy/plan", "analyst", json=BODY | {"epsilon_selection": 0.2})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["selection_slots"] == 4 and out["stream"]["max_tables"] == 3 + 4
    assert out["slot_share"] == pytest.approx(1 / 7)
    assert out["slot_noise_factor"] == pytest.approx(7 / 3)
    assert out["epsilon_without_slots"] < out["epsilon"]
    assert out["raw_rows_held"] == out["hot_windows"] * 5000 * out["window_seconds"] // 86400
    stream = out["stream"] | {"name": unique("planned")}
    created = await api.post("/v1/streams", json=stream)
    assert created.status_code == 201, created.text
    split = await api.get(f"/v1/streams/{stream['name']}/privacy")
    served = {r["table"]: r for r in _find(split.json(), "budget_split")}
    for t in out["tables"]:
        assert served[t["table"]]["epsilon"] == pytest.approx(t["epsilon"], rel=1e-6)
    slot = served["(selected groups)"]
    assert slot["slots"] == 4
    assert slot["epsilon"] == pytest.approx(out["epsilon"] * out["slot_share"], rel=1e-6)


def _find(doc: object, key: str) -> list[dict]:
    """The first value under ``key`` anywhere in a JSON document."""
    if isinstance(doc, dict):
        if key in doc:
            return list(doc[key])
        doc = list(doc.values())
    if isinstance(doc, list):
        for item in doc:
            found = _find(item, key)
            if found:
                return found
    return []


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"observations_per_window": 0}, "observations_per_window"),
        ({"observations_per_window": 10**13}, "observations_per_window"),
        ({"cardinalities": {}}, "cardinalities"),
        ({"cardinalities": {f"f{i}": 2 for i in range(65)}}, "cardinalities"),
        ({"cardinalities": {"user": 10**10}}, "cardinalities"),
        ({"cardinalities": {"bad name!": 3}}, "cardinalities"),
        ({"target_loss": 0.9}, "target_loss"),
        ({"target_dp_cost": "NaN"}, "target_dp_cost"),
        ({"max_epsilon": 1e9}, "max_epsilon"),
        ({"max_exposure": 0}, "max_exposure"),
        ({"labels": 1}, "labels"),
        ({"surprise": 1}, "surprise"),
        ({"selection_slots": 2}, "selection_slots"),  # slots only selection can fill
        ({"selection_slots": 65, "epsilon_selection": 0.1}, "selection_slots"),
        ({"epsilon_selection": -1}, "epsilon_selection"),
        ({"max_hot_seconds": 3600}, "max_hot_seconds"),  # less than one window
        ({"hot_windows": 0}, "hot_windows"),
    ],
)
async def test_bad_input_is_a_422_naming_the_field(api: Api, over: dict, field: str) -> None:
    r = await api.post("/v1/privacy/plan", "analyst", json=BODY | over)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "ValidationError" and field in body["detail"], body


@pytest.mark.parametrize(
    "body",
    [
        {"observations_per_window": 1, "cardinalities": {"u": 10**9}, "labels": 64,
         "max_contributions_per_window": 10_000, "depth": 16, "max_epsilon": 0.01},
        {"observations_per_window": 10**12, "cardinalities": {f"f{i}": 1 for i in range(64)},
         "target_dp_cost": 1.0000001, "max_exposure": 0.5, "window_seconds": 366 * 86400},
        {"observations_per_window": 10**12, "cardinalities": {"u": 10**9}, "max_epsilon": 100,
         "max_exposure": 1e-4, "hot_windows": 100, "collisions": 0.001},
    ],
)  # fmt: skip
async def test_the_bounds_give_an_answer_not_a_500(api: Api, body: dict) -> None:
    r = await api.post("/v1/privacy/plan", "analyst", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["width"] <= 1 << 24 and out["epsilon"] <= body.get("max_epsilon", 1.0)
    assert out["retention_windows"] <= 10_000 and out["window_seconds"] <= 366 * 86400
    cfg = StreamCreate.model_validate(out["stream"])
    assert cfg.max_tables is not None
    cells = cfg.max_tables * len(cfg.labels) * cfg.sketch.depth * cfg.sketch.width
    assert cells <= MAX_CELLS  # a window's tables fit in 256 MiB


async def test_no_key_is_refused(api: Api) -> None:
    r = await api.client.post("/v1/privacy/plan", json=BODY)
    assert r.status_code == 401, r.text


def test_the_stream_body_matches_the_helpers_shape() -> None:
    assert set(make_plan(PlanRequest.model_validate(BODY)).stream_body("x")) <= set(
        stream_body("x")
    ) | {"max_tables", "sketch", "privacy", "retention_windows", "hot_windows"}
