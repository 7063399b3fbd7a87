"""The small read-only endpoints the console reads (on both backends, in process): who a key
is, a stream's models, the audit log newest first with its filters, and the chain's
verification; each refuses the roles it does not admit and bounds its inputs (422 naming the
parameter)."""

from __future__ import annotations

import pytest

from tests.conftest import Api, unique
from tests.helpers import stream_body


async def test_whoami_names_the_key_and_its_role(api: Api) -> None:
    for role in ("admin", "producer", "model", "analyst"):
        r = await api.get("/v1/whoami", role=role)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["role"] == role
        assert body["key_id"] == api.keys[role].split("_")[1]
    assert (await api.client.get("/v1/whoami")).status_code == 401


async def test_models_list_the_streams_models_with_status(api: Api) -> None:
    name = unique("m")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    ids = []
    for m in ("first", "second"):
        r = await api.post(f"/v1/streams/{name}/models", role="model", json={"name": m})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    r = await api.get(f"/v1/streams/{name}/models", role="model")
    assert r.status_code == 200, r.text
    models = r.json()["models"]
    assert [m["id"] for m in models] == ids  # oldest first
    assert {m["status"] for m in models} == {"untrained"}
    assert all(m["retrain_deadline"] for m in models)
    r = await api.get(f"/v1/streams/{name}/models", role="model", params={"limit": 1})
    assert [m["id"] for m in r.json()["models"]] == ids[:1]
    r = await api.get(f"/v1/streams/{name}/models", role="model", params={"limit": 1001})
    assert r.status_code == 422 and "limit" in r.json()["detail"]
    assert (await api.get(f"/v1/streams/{name}/models", role="producer")).status_code == 403
    assert (await api.get("/v1/streams/nope-404/models", role="model")).status_code == 404


async def test_audit_recent_is_newest_first_and_filters(api: Api) -> None:
    await api.add_keys(one="analyst", two="analyst", three="producer")  # no audit entries
    for role in ("analyst", "curator"):
        r = await api.post("/v1/admin/keys", json={"role": role, "name": unique("k")})
        assert r.status_code == 201
    r = await api.get("/v1/admin/audit/recent", params={"limit": 1000})
    assert r.status_code == 200, r.text
    seqs = [e["seq"] for e in r.json()["entries"]]
    assert seqs == sorted(seqs, reverse=True) and len(seqs) >= 2
    page = (await api.get("/v1/admin/audit/recent", params={"limit": 1})).json()
    assert [e["seq"] for e in page["entries"]] == seqs[:1] and page["next_before"] == seqs[0]
    older = await api.get("/v1/admin/audit/recent", params={"limit": 1, "before": seqs[0]})
    assert [e["seq"] for e in older.json()["entries"]] == seqs[1:2]

    made = await api.get("/v1/admin/audit/recent", params={"action": "admin.create_key"})
    entries = made.json()["entries"]
    assert len(entries) >= 2 and {e["action"] for e in entries} == {"admin.create_key"}
    actor = entries[0]["actor"]
    mine = await api.get("/v1/admin/audit/recent", params={"actor": actor, "limit": 1000})
    assert {e["actor"] for e in mine.json()["entries"]} == {actor}
    none = await api.get("/v1/admin/audit/recent", params={"actor": "nobody"})
    assert none.json() == {"entries": [], "next_before": None}

    for params, field in [
        ({"before": 0}, "before"),
        ({"limit": 1001}, "limit"),
        ({"action": "x" * 65}, "action"),
    ]:
        r = await api.get("/v1/admin/audit/recent", params=params)
        assert r.status_code == 422 and field in r.json()["detail"], (params, r.text)
    assert (await api.get("/v1/admin/audit/recent", role="analyst")).status_code == 403


async def test_audit_verify_returns_the_head_and_checks_an_expected_one(api: Api) -> None:
    r = await api.post("/v1/admin/keys", json={"role": "model", "name": unique("k")})
    assert r.status_code == 201
    v = (await api.get("/v1/admin/audit/verify")).json()
    assert v["ok"] and v["problem"] is None and v["entries"] == v["head_seq"] >= 1
    head = await api.get("/v1/admin/audit/recent", params={"limit": 1})
    newest = head.json()["entries"][0]
    assert (v["head_seq"], v["head_hash"]) == (newest["seq"], newest["hash"])
    good = f"{v['head_seq']}:{v['head_hash']}"
    assert (await api.get("/v1/admin/audit/verify", params={"expect_head": good})).json()["ok"]
    bad = f"{v['head_seq']}:{'0' * 64}"
    r = (await api.get("/v1/admin/audit/verify", params={"expect_head": bad})).json()
    assert not r["ok"] and r["problem"]


@pytest.mark.parametrize("value", ["12", "0:" + "a" * 64, "1:" + "a" * 63, "1:" + "g" * 64])
async def test_audit_verify_refuses_a_malformed_head(api: Api, value: str) -> None:
    r = await api.get("/v1/admin/audit/verify", params={"expect_head": value})
    assert r.status_code == 422 and "expect_head" in r.json()["detail"]
    assert (await api.get("/v1/admin/audit/verify", role="analyst")).status_code == 403
