"""Issue 13 items 1 and 9: unlock requests beyond the current window or with integers past
SQL's range are refused (4xx naming the field); exports end with a manifest of rows per window
(counted from the decrypted segments) naming the windows not (yet) sealed; admins list
requests by status, newest first."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import orjson
import pyarrow as pa
from sqlalchemy import update

from service.coldstore import service as coldstore
from service.coldstore.schemas import MAX_WINDOW
from service.db.models import UnlockRequest
from tests.coldstore.conftest import Key, rows, sealed_stream
from tests.conftest import Api

REASON = "incident 4711: audit a complaint"


async def _sealed(api: Api) -> str:
    name = await sealed_stream(api, [rows(12, "w1"), rows(7, "w2")])
    stats = await coldstore.seal_stream(ctx=api.ctx, name=name, segment_entries=5)
    assert stats.windows_sealed == 2
    return name


async def _file(api: Api, name: str, lo: int, hi: int) -> str:
    r = await api.post(
        "/v1/admin/unlock-requests",
        "analyst",
        json={"stream": name, "from_window": lo, "to_window": hi, "justification": REASON},
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def _grant(api: Api, rid: str, key: Key) -> None:
    a1, a2 = await api.add_keys(a1="admin", a2="admin")
    for admin, share in ((a1, key.shares[0]), (a2, key.shares[1])):
        r = await api.client.post(
            f"/v1/admin/unlock-requests/{rid}/approve",
            headers={"Authorization": f"Bearer {admin}"},
            json={"share": share},
        )
        assert r.status_code == 200, r.text
    assert r.json()["status"] == "granted"


async def test_integers_past_sql_range_are_a_422_naming_the_field(api: Api, cold_key: Key) -> None:
    name = await _sealed(api)
    huge = 9223372036854775808  # 2^63
    for field in ("from_window", "to_window"):
        body = {"stream": name, "from_window": 1, "to_window": 2, "justification": REASON}
        body[field] = huge
        r = await api.post("/v1/admin/unlock-requests", "analyst", json=body)
        assert r.status_code == 422, r.text
        assert field in r.text and str(MAX_WINDOW) in r.text
    body = {"stream": name, "from_window": 1, "to_window": 1, "justification": REASON}
    r = await api.post("/v1/admin/unlock-requests", "analyst", json={**body, "ttl_seconds": huge})
    assert r.status_code == 422 and "ttl_seconds" in r.text
    rid = await _file(api, name, 1, 2)
    for field in ("from_window", "to_window"):
        r = await api.get(
            f"/v1/admin/unlock-requests/{rid}/export", "analyst", params={field: str(huge)}
        )
        assert r.status_code == 422 and field in r.text, r.text
    r = await api.get("/v1/admin/unlock-requests", params={"limit": str(huge)})
    assert r.status_code == 422 and "limit" in r.text
    # the OpenAPI document states the ranges
    doc = (await api.client.get("/openapi.json")).json()
    props = doc["components"]["schemas"]["UnlockRequestIn"]["properties"]
    assert str(MAX_WINDOW) in orjson.dumps(props["from_window"]).decode()


async def test_windows_beyond_the_current_one_are_refused(api: Api, cold_key: Key) -> None:
    name = await _sealed(api)  # windows 1, 2 closed; 3 open
    for lo, hi, field in ((1, 4, "to_window"), (4, 9, "from_window"), (5, 5, "from_window")):
        r = await api.post(
            "/v1/admin/unlock-requests",
            "analyst",
            json={"stream": name, "from_window": lo, "to_window": hi, "justification": REASON},
        )
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert detail.startswith(field) and "current window is 3" in detail
    assert await _file(api, name, 1, 3)  # up to the open window: accepted
    future = datetime.now(UTC) + timedelta(days=1)
    r = await api.post(
        "/v1/admin/unlock-requests",
        "analyst",
        json={
            "stream": name,
            "from_time": (future - timedelta(days=2)).isoformat(),
            "to_time": future.isoformat(),
            "justification": REASON,
        },
    )
    assert r.status_code == 422 and r.json()["detail"].startswith("to_time")


async def test_the_export_manifest_counts_rows_per_window_and_names_the_open_one(
    api: Api, cold_key: Key
) -> None:
    name = await _sealed(api)
    r = await api.post(
        f"/v1/streams/{name}/observations", "producer", json={"observations": rows(4, "w3")}
    )
    assert r.status_code == 202
    rid = await _file(api, name, 1, 3)
    await _grant(api, rid, cold_key)
    r = await api.get(f"/v1/admin/unlock-requests/{rid}/export", "analyst")
    assert r.status_code == 200
    lines = [orjson.loads(x) for x in r.content.splitlines()]
    manifest = lines[-1]["manifest"]
    assert [x["observation"]["id"][:2] for x in lines[:-1]] == ["w1"] * 12 + ["w2"] * 7
    assert manifest["rows_per_window"] == [
        {"window": 1, "rows": 12},
        {"window": 2, "rows": 7},
    ]
    assert manifest["rows"] == 19 and manifest["complete"] and manifest["failed_segments"] == 0
    assert [(w["window"], w["state"]) for w in manifest["not_sealed"]] == [(3, "open")]
    assert "not (yet) sealed" in manifest["not_sealed"][0]["note"]
    # the same manifest closes the Arrow stream
    r = await api.get(
        f"/v1/admin/unlock-requests/{rid}/export",
        "analyst",
        params={"format": "arrow", "from_window": 2, "to_window": 3},
    )
    reader = pa.ipc.open_stream(io.BytesIO(r.content))
    metas = []
    while True:
        try:
            batch, meta = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            break
        metas.append(meta)
    arrow_manifest = orjson.loads(metas[-1][b"manifest"])["manifest"]
    assert arrow_manifest["rows_per_window"] == [{"window": 2, "rows": 7}]
    assert [w["window"] for w in arrow_manifest["not_sealed"]] == [3]


async def test_admins_list_requests_by_status_newest_first(api: Api, cold_key: Key) -> None:
    name = await _sealed(api)
    ids = [await _file(api, name, 1, 1) for _ in range(4)]
    async with api.ctx.sessionmaker() as s, s.begin():  # distinct creation times
        for i, rid in enumerate(ids):
            await s.execute(
                update(UnlockRequest)
                .where(UnlockRequest.id == rid)
                .values(created_at=datetime(2030, 1, 1, tzinfo=UTC) + timedelta(minutes=i))
            )
    await _grant(api, ids[1], cold_key)
    r = await api.post(f"/v1/admin/unlock-requests/{ids[2]}/close", "analyst")
    assert r.status_code == 200
    async with api.ctx.sessionmaker() as s, s.begin():
        await s.execute(
            update(UnlockRequest).where(UnlockRequest.id == ids[3]).values(status="expired")
        )

    async def listed(**params: object) -> list[str]:
        r = await api.get("/v1/admin/unlock-requests", params=params)
        assert r.status_code == 200, r.text
        return [x["id"] for x in r.json()["requests"] if x["id"] in ids]

    assert await listed(status="pending") == [ids[0]]
    assert await listed(status="granted") == [ids[1]]
    assert await listed(status="closed") == [ids[3], ids[2]]  # expired counts as closed
    # pages of one, newest first, follow next_before to the end
    seen: list[str] = []
    params: dict[str, object] = {"limit": 1}
    while True:
        r = await api.get("/v1/admin/unlock-requests", params=params)
        page = r.json()
        seen += [x["id"] for x in page["requests"]]
        if page["next_before"] is None:
            break
        params["before"] = page["next_before"]
    assert [i for i in seen if i in ids] == ids[::-1]
    assert seen[:4] == ids[::-1]  # the newest of all (created in 2030)
    r = await api.get("/v1/admin/unlock-requests", params={"status": "refused"})
    assert r.status_code == 422 and "status" in r.text
    r = await api.get("/v1/admin/unlock-requests", params={"limit": 501})
    assert r.status_code == 422 and "limit" in r.text
    # an analyst lists the requests it filed, and no other analyst's
    await api.add_keys(other="analyst")
    theirs = await api.post(
        "/v1/admin/unlock-requests",
        "other",
        json={"stream": name, "from_window": 1, "to_window": 1, "justification": "another reason"},
    )
    assert theirs.status_code == 201, theirs.text
    r = await api.get("/v1/admin/unlock-requests", "analyst", params={"limit": 500})
    assert r.status_code == 200, r.text
    own = [x["id"] for x in r.json()["requests"]]
    assert set(ids) <= set(own) and theirs.json()["id"] not in own
    r = await api.get("/v1/admin/unlock-requests", "other")
    assert [x["id"] for x in r.json()["requests"]] == [theirs.json()["id"]]
    r = await api.get("/v1/admin/unlock-requests", "producer")
    assert r.status_code == 403
