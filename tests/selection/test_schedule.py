"""The configuration of ⊥ and of the round schedule (``privacy.selection_threshold``,
``privacy.selection_rounds``): defaults, limits (a 422 naming the field) and the ledger's
parameters; a stored configuration from before the fields gets Q = the free slots, the bound
its rounds already obeyed (service.core.dp.accounting)."""

from __future__ import annotations

import pytest

from service.core.streamconfig import StreamCreate
from tests.conftest import Api, unique
from tests.helpers import stream_body


async def test_defaults_are_aic_indifference_and_the_free_slots(api: Api) -> None:
    name = unique("sched")
    body = stream_body(name, privacy={"epsilon_selection": 0.5})  # 3 features, 4 free slots
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    privacy = (await api.get(f"/v1/streams/{name}")).json()["privacy"]
    assert privacy["selection_threshold"] == 0.0 and privacy["selection_rounds"] == 4
    led = (await api.get(f"/v1/streams/{name}/privacy", role="analyst")).json()
    part = led["observation"]["parts"][1]
    assert part["parameters"]["threshold"] == 0.0 and part["parameters"]["max_rounds"] == 4
    assert any("at most 4 rounds" in note and "epochs 2 … 5" in note for note in led["notes"])


async def test_more_rounds_than_slots_are_charged(api: Api) -> None:
    name = unique("sched")
    privacy = {"epsilon_selection": 0.5, "selection_rounds": 9, "user_key": "user"}
    body = stream_body(name, hot_windows=2, privacy=privacy)
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    led = (await api.get(f"/v1/streams/{name}/privacy", role="analyst")).json()
    assert led["observation"]["parts"][1]["parameters"]["rounds"] == 2  # min(H = 2, Q = 9)
    user = led["user"]["parts"][1]
    assert user["parameters"]["rounds"] == 9  # not the 4 free slots
    assert user["epsilon"] == pytest.approx(9 * 0.5 * 2)  # group c·H = 2


@pytest.mark.parametrize(
    ("field", "value", "limit"),
    [
        ("selection_threshold", 65, "less than or equal to 64"),
        ("selection_threshold", -65, "greater than or equal to -64"),
        ("selection_threshold", "high", "valid number"),
        ("selection_rounds", 0, "greater than or equal to 1"),
        ("selection_rounds", 10_001, "less than or equal to 10000"),
    ],
)
async def test_out_of_range_values_are_refused(
    api: Api, field: str, value: object, limit: str
) -> None:
    body = stream_body(unique("sched"), privacy={"epsilon_selection": 0.5, field: value})
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == 422 and field in r.text and limit in r.text, r.text


def test_a_null_threshold_is_the_fill_every_pick_rule() -> None:
    cfg = StreamCreate.model_validate(stream_body("s", privacy={"selection_threshold": None}))
    assert cfg.privacy.selection_threshold is None


def test_a_stored_configuration_from_before_gets_the_free_slots() -> None:
    stored = StreamCreate.model_validate(stream_body("s", max_tables=6)).model_dump(mode="json")
    del stored["privacy"]["selection_rounds"], stored["privacy"]["selection_threshold"]
    cfg = StreamCreate.model_validate(stored)
    assert cfg.privacy.selection_rounds == 2  # 6 − 3 features − the prior
