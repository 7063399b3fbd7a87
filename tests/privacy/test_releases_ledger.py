"""The ledger's ``releases`` section (docs/ARCHITECTURE.md, "Privacy ledger"): every release
kind of a stream, DP or not, in the same fields; a k-anonymised release and a
re-identification audit are listed as non-DP, and the audit's exact figures are seen only by
admins and its creator."""

from __future__ import annotations

import random
from typing import Any

import pytest

from service.audits import service as audits_service
from service.core.reidentification import attacks as pu
from tests.conftest import Api
from tests.helpers import ingest, new_stream, obs
from workers.jobs import anonymize_run, reidentification_run

FIELDS = {
    "kind", "dp", "guarantee", "epsilon", "delta", "neighbour", "observer", "unit", "per_user",
    "reveals",
    "to", "readers", "created", "lifetime", "items",
}  # fmt: skip
EXACT = {"id", "n", "accuracy", "summary"}


@pytest.fixture(autouse=True)
def small_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        audits_service, "CONFIG", pu.PUConfig(batch_size=100, t_pre=20, t_tune=20, pu_epochs=5)
    )


def _rows(n: int) -> list[dict[str, Any]]:
    rnd = random.Random(5)
    return [obs(f"u{i % 7}", f"i{i % 3}", rnd.randint(18, 70), "01"[i % 3 == 0]) for i in range(n)]


async def _ledger(api: Api, name: str, role: str) -> dict[str, Any]:
    r = await api.get(f"/v1/streams/{name}/privacy", role=role)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _kind(led: dict[str, Any], kind: str) -> dict[str, Any]:
    (entry,) = [e for e in led["releases"] if e["kind"] == kind]
    return entry


async def test_every_release_kind_is_listed_dp_or_not(api: Api) -> None:
    name = await new_stream(
        api,
        "relled",
        privacy={"mechanism": "laplace", "epsilon": 0.5, "epsilon_selection": 0.1},
        releasable=["age", "label"],
    )
    await ingest(api, name, _rows(60))
    r = await api.post(
        "/v1/anonymizations",
        role="analyst",
        json={
            "source": {"stream": name},
            "k": 3,
            "quasi_identifiers": [{"name": "age", "kind": "range"}],
            "keep": ["label"],
        },
    )
    assert r.status_code == 202, r.text
    a = r.json()["id"]
    assert (await anonymize_run({"app": api.ctx}, id=a))["status"] == "done"
    r = await api.post(
        "/v1/audits/reidentification",
        role="analyst",
        json={
            "source": {"stream": name},
            "positive_label": "1",
            "release": {"kind": "class_mean"},
            "attacks": ["kmeans"],
        },
    )
    assert r.status_code == 202, r.text
    ra = r.json()["id"]
    assert (await reidentification_run({"app": api.ctx}, id=ra))["status"] == "done"

    led = await _ledger(api, name, "analyst")
    for e in led["releases"]:
        assert set(e) == FIELDS, e["kind"]
    kinds = [e["kind"] for e in led["releases"]]
    assert kinds[:2] == ["count tables", "count-table selection"]
    # the DP parts, in the ledger's own figures
    parts = {p["name"]: p for p in led["observation"]["parts"]}
    tables = _kind(led, "count tables")
    assert tables["dp"] is True and tables["epsilon"] == parts["count_tables"]["epsilon"]
    assert tables["neighbour"].startswith("add or remove") or "swap" in tables["neighbour"]
    selection = _kind(led, "count-table selection")
    assert selection["dp"] is True and selection["epsilon"] == parts["table_selection"]["epsilon"]

    hot = _kind(led, "hot rows in the train set")
    assert hot["dp"] is False and hot["epsilon"] is None and hot["to"] == ["model", "admin"]
    assert "['age']" in hot["reveals"]  # the passed-through feature, by name

    anon = _kind(led, "k-anonymised release")
    assert anon["dp"] is False and anon["guarantee"] == "non-DP: k-anonymity, syntactic"
    assert anon["epsilon"] is None and anon["neighbour"] is None
    assert anon["to"] == ["analyst", "admin"] and "creat" in anon["readers"]
    (item,) = anon["items"]
    assert item["id"] == a and item["yours"] is True and item["k"] == 3
    assert item["quasi_identifiers"] == ["age"] and item["keep"] == ["label"]
    assert item["windows"] == [1, 1] and item["deleted_at_roll_to_epoch"] == 2
    assert item["created_at"].endswith("Z") and item["expires_at"].endswith("Z")

    audit = _kind(led, "re-identification audit")
    assert audit["dp"] is False
    assert audit["guarantee"] == "non-DP: re-identification audit result, exact statistics"
    (item,) = audit["items"]
    assert item["id"] == ra and item["n"] == 60  # the creator sees the exact figures
    assert item["expires_at"].endswith("Z")

    # another analyst sees that both exist, not whose the release is
    await api.add_keys(other="analyst")
    (item,) = _kind(await _ledger(api, name, "other"), "k-anonymised release")["items"]
    assert item["yours"] is False and "created_by" not in item


async def test_only_admins_and_the_creator_see_an_audits_exact_figures(api: Api) -> None:
    name = await new_stream(api, "relaud")
    await ingest(api, name, _rows(45))
    await api.add_keys(other="analyst")
    r = await api.post(
        "/v1/audits/reidentification",
        role="other",
        json={
            "source": {"stream": name},
            "positive_label": "1",
            "release": {"kind": "class_mean"},
            "attacks": ["kmeans"],
        },
    )
    assert r.status_code == 202, r.text
    ra = r.json()["id"]
    assert (await reidentification_run({"app": api.ctx}, id=ra))["status"] == "done"
    for role in ("analyst", "model", "producer"):
        led = await _ledger(api, name, role)
        ri = led["reidentification"]
        assert ri is not None and ri["release"] == "class_mean" and ri["at"].endswith("Z")
        assert not EXACT & set(ri), (role, ri)
        assert "withheld" in ri["exact_figures"]
        (item,) = _kind(led, "re-identification audit")["items"]
        assert not EXACT & set(item), (role, item)
    for role in ("other", "admin"):
        led = await _ledger(api, name, role)
        ri = led["reidentification"]
        assert ri["id"] == ra and ri["n"] == 45 and "prior" in ri["accuracy"], role
        (item,) = _kind(led, "re-identification audit")["items"]
        assert item["n"] == 45, role
