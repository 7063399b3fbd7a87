"""Whom each figure of the ledger protects, and what the per-user figure covers
(docs/ARCHITECTURE.md, "Privacy ledger", "Threat model and promises")."""

from __future__ import annotations

import pytest

from service.core.dp.accounting import BOTH, CONTINUAL, ONE_TIME
from tests.conftest import Api
from tests.helpers import new_stream


async def _ledger(api: Api, name: str) -> dict:
    r = await api.get(f"/v1/streams/{name}/privacy", role="analyst")
    assert r.status_code == 200, r.text
    return r.json()


PRIVACY = {
    "mechanism": "laplace",
    "epsilon": 0.5,
    "epsilon_selection": 0.1,
    "user_key": "user",
    "max_contributions_per_window": 2,
}


async def test_every_part_says_whom_it_protects_against(api: Api) -> None:
    """Per observation: against both observers (disjoint windows). Per user: the one-time
    reader of the stores gets (R + H)·ε_window; a continual observer of featurize and the
    train set gets ε_window per window the user is active in, with no lifetime bound."""
    name = await new_stream(api, "obs", hot_windows=2, retention_windows=5, privacy=PRIVACY)
    led = await _ledger(api, name)
    obs = led["observation"]
    assert obs["observer"] == BOTH and obs["level"] == "event"
    assert obs["neighbour"] == "add or remove one observation"
    for part in obs["parts"]:
        assert part["observer"] == BOTH and part["level"] == "event"
        assert part["neighbour"] == "add or remove one observation"
    user = led["user"]
    assert user["observer"] == ONE_TIME and user["level"] == "user"
    assert user["neighbour"].startswith("add or remove one user")
    tables, selection = user["parts"]
    assert tables["observer"] == ONE_TIME and tables["parameters"]["windows_composed"] == 7
    assert selection["observer"] == BOTH  # the picks are public and kept
    assert all(p["level"] == "user" for p in user["parts"])
    assert user["epsilon"] == pytest.approx(7 * 0.5 + 4 * 0.1 * 2 * 2) and user["unbounded"] == []
    cont = led["user_continual"]
    assert cont["observer"] == CONTINUAL and cont["epsilon"] is None
    assert cont["epsilon_per_active_window"] == pytest.approx(0.5)  # c/k = 2/2
    assert cont["epsilon_selection_total"] == pytest.approx(4 * 0.1 * 2 * 2)
    assert "n·0.5" in cont["formula"] and cont["unbounded"]
    assert cont["parts"][0]["observer"] == CONTINUAL
    assert cont["parts"][0]["parameters"]["windows_composed"] == 1


async def test_a_linked_record_queue_leaves_the_per_user_figure_unbounded(api: Api) -> None:
    """A user may submit any number of candidates to a record queue linked to the stream: no
    per-user bound exists for that part, so the per-user ε is null, with the reason and what
    the figure still covers; per observation the queue's (ε, δ) per candidate is composed."""
    await api.add_keys(curator="curator")
    name = await new_stream(api, "obq", privacy=PRIVACY)
    before = await _ledger(api, name)
    assert before["user"]["epsilon"] is not None
    body = {
        "name": f"q-{name}",
        "beta": 0.1,
        "k": 10,
        "payload_kind": "record",
        "stream": name,
        "uncertainty": "client",
    }
    r = await api.post("/v1/queues", "curator", json=body)
    assert r.status_code == 201, r.text
    led = await _ledger(api, name)
    user = led["user"]
    assert user["epsilon"] is None
    assert len(user["unbounded"]) == 1 and f"q-{name}" in user["unbounded"][0]
    assert "no per-user bound" in user["unbounded"][0]
    assert "not the candidates a user submits" in user["covers"]
    assert [p["name"] for p in user["parts"]] == ["count_tables", "table_selection"]
    queue_part = led["observation"]["parts"][-1]
    assert queue_part["name"] == f"annotation_queue:q-{name}"
    assert queue_part["neighbour"] == "add or remove one submitted candidate"
    assert led["observation"]["epsilon"] == pytest.approx(
        before["observation"]["epsilon"] + queue_part["epsilon"]
    )
    assert led["user_continual"]["unbounded"][-1] == user["unbounded"][0]
