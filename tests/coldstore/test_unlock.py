"""Break-glass unlock over HTTP (DESIGN §10): request, approvals with shares, grant, export of
the requested range only, expiry and close; refusals; tamper detection at export."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from sqlalchemy import select, update

from service.admin import service as keys_service
from service.coldstore import crypto
from service.coldstore import service as coldstore
from service.db.models import ColdSegment, Stream, UnlockRequest
from tests.coldstore.conftest import Key, rows, sealed_stream
from tests.conftest import Api


async def _admins(api: Api, n: int) -> list[str]:
    async with api.ctx.sessionmaker() as s, s.begin():
        return [(await keys_service.create(session=s, role="admin")).key for _ in range(n)]


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _sealed(api: Api) -> str:
    name = await sealed_stream(api, [rows(12, "w1"), rows(7, "w2"), rows(5, "w3")])
    stats = await coldstore.seal_stream(ctx=api.ctx, name=name, segment_entries=5)
    assert stats.windows_sealed == 3
    return name


async def _request(api: Api, name: str, **over: object) -> dict:
    body = {
        "stream": name,
        "from_window": 1,
        "to_window": 2,
        "justification": "incident 4711: audit a complaint",
    }
    body.update(over)
    r = await api.post("/v1/admin/unlock-requests", "analyst", json=body)
    assert r.status_code == 201, r.text
    return r.json()


async def _approve(api: Api, rid: str, admin: str, share: str):  # type: ignore[no-untyped-def]
    return await api.client.post(
        f"/v1/admin/unlock-requests/{rid}/approve", headers=_h(admin), json={"share": share}
    )


async def test_full_flow_two_of_three_exports_exactly_the_requested_windows(
    api: Api, cold_key: Key
) -> None:
    name = await _sealed(api)
    req = await _request(api, name)
    assert req["status"] == "pending" and req["threshold"] == 2
    a1, a2 = await _admins(api, 2)
    # before the grant, nothing can be exported
    r = await api.get(f"/v1/admin/unlock-requests/{req['id']}/export", "analyst")
    assert r.status_code == 409
    r = await _approve(api, req["id"], a1, cold_key.shares[2])
    assert r.status_code == 200 and r.json()["status"] == "pending" and r.json()["approvals"] == 1
    r = await _approve(api, req["id"], a2, cold_key.shares[0])
    assert r.status_code == 200 and r.json()["status"] == "granted", r.text
    r = await api.get(f"/v1/admin/unlock-requests/{req['id']}/export", "analyst")
    assert r.status_code == 200
    lines = [orjson.loads(x) for x in r.content.splitlines()]
    assert [x["observation"]["id"] for x in lines] == [f"w1-{i}" for i in range(12)] + [
        f"w2-{i}" for i in range(7)
    ]
    assert {x["window"] for x in lines} == {1, 2}
    assert lines[0]["observation"]["features"]["user"] == "w1-u0"
    # a part of the range, as Arrow
    r = await api.get(
        f"/v1/admin/unlock-requests/{req['id']}/export",
        "analyst",
        params={"format": "arrow", "from_window": 2, "to_window": 2},
    )
    assert r.status_code == 200
    table = pa.ipc.open_stream(io.BytesIO(r.content)).read_all()
    assert table.num_rows == 7 and set(table.column("window").to_pylist()) == {2}
    assert table.column("error").null_count == 7
    # outside the request: refused, and so is another analyst or an admin exporting
    r = await api.get(
        f"/v1/admin/unlock-requests/{req['id']}/export",
        "analyst",
        params={"from_window": 2, "to_window": 3},
    )
    assert r.status_code == 403 and "outside" in r.json()["detail"]
    r = await api.get(f"/v1/admin/unlock-requests/{req['id']}/export", "admin")
    assert r.status_code == 403
    # close: the key is wiped, export refused
    r = await api.post(f"/v1/admin/unlock-requests/{req['id']}/close", "analyst")
    assert r.json()["status"] == "closed"
    assert not api.ctx.caches["vault"].grants
    r = await api.get(f"/v1/admin/unlock-requests/{req['id']}/export", "analyst")
    assert r.status_code == 409


async def test_refusals_wrong_duplicate_and_too_few_shares(api: Api, cold_key: Key) -> None:
    name = await _sealed(api)
    req = await _request(api, name)
    rid = req["id"]
    a1, a2, a3 = await _admins(api, 3)
    words = cold_key.shares[0].split()
    words[3] = "academic" if words[3] != "academic" else "acid"
    r = await _approve(api, rid, a1, " ".join(words))
    assert (
        r.status_code == 422
        and "share" in r.json()["detail"]
        and words[3] not in r.json()["detail"]
    )
    assert (await _approve(api, rid, a1, cold_key.shares[0])).status_code == 200
    r = await _approve(api, rid, a1, cold_key.shares[1])  # same admin twice
    assert r.status_code == 409 and "already approved" in r.json()["detail"]
    r = await _approve(api, rid, a2, cold_key.shares[0])  # same share by another admin
    assert r.status_code == 409 and "already submitted" in r.json()["detail"]
    st = (await api.get(f"/v1/admin/unlock-requests/{rid}", "analyst")).json()
    assert st["status"] == "pending" and st["approvals"] == 1  # too few: no grant
    # a share of another key completes the count but not the key: refused, approvals reset
    other = crypto.generate_key(shares=3, threshold=2)
    r = await _approve(api, rid, a3, other.shares[1])
    assert r.status_code == 422
    st = (await api.get(f"/v1/admin/unlock-requests/{rid}", "analyst")).json()
    assert st["status"] == "pending" and st["approvals"] == 0
    # the analyst cannot approve
    r = await api.post(
        f"/v1/admin/unlock-requests/{rid}/approve", "analyst", json={"share": cold_key.shares[0]}
    )
    assert r.status_code == 403


async def test_an_expired_grant_is_closed_and_its_key_wiped(api: Api, cold_key: Key) -> None:
    name = await _sealed(api)
    req = await _request(api, name)
    a1, a2 = await _admins(api, 2)
    await _approve(api, req["id"], a1, cold_key.shares[0])
    assert (await _approve(api, req["id"], a2, cold_key.shares[1])).json()["status"] == "granted"
    async with api.ctx.sessionmaker() as s, s.begin():  # the clock moves past the TTL
        await s.execute(
            update(UnlockRequest)
            .where(UnlockRequest.id == req["id"])
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    api.ctx.caches["vault"].grants[req["id"]].expires_at = datetime.now(UTC) - timedelta(seconds=1)
    r = await api.get(f"/v1/admin/unlock-requests/{req['id']}/export", "analyst")
    assert r.status_code == 409 and "expired" in r.json()["detail"]
    assert req["id"] not in api.ctx.caches["vault"].grants


async def test_tampered_segments_are_reported_and_the_export_goes_on(
    api: Api, cold_key: Key
) -> None:
    name = await _sealed(api)
    async with api.ctx.sessionmaker() as s:
        sid = await s.scalar(select(Stream.id).where(Stream.name == name))
        segs = list(
            await s.scalars(
                select(ColdSegment)
                .where(ColdSegment.stream_id == sid)
                .order_by(ColdSegment.epoch, ColdSegment.id)
            )
        )
    assert [x.epoch for x in segs] == [1, 1, 1, 2, 2, 3]
    # a flipped byte in window 1's second segment
    p = Path(segs[1].path)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x40
    p.write_bytes(bytes(data))
    # window 2's two segments with their headers swapped
    a, b = Path(segs[3].path).read_bytes(), Path(segs[4].path).read_bytes()
    _, ha, body_a = crypto.split(a)
    _, hb, body_b = crypto.split(b)
    Path(segs[3].path).write_bytes(crypto.MAGIC + len(hb).to_bytes(4, "big") + hb + body_a)
    Path(segs[4].path).write_bytes(crypto.MAGIC + len(ha).to_bytes(4, "big") + ha + body_b)
    req = await _request(api, name, to_window=3)
    a1, a2 = await _admins(api, 2)
    await _approve(api, req["id"], a1, cold_key.shares[0])
    await _approve(api, req["id"], a2, cold_key.shares[2])
    r = await api.get(f"/v1/admin/unlock-requests/{req['id']}/export", "analyst")
    assert r.status_code == 200
    lines = [orjson.loads(x) for x in r.content.splitlines()]
    errors = [x for x in lines if "error" in x]
    assert [(e["window"], e["segment"]) for e in errors] == [
        (1, Path(segs[1].path).name),
        (2, Path(segs[3].path).name),
        (2, Path(segs[4].path).name),
    ]
    ids = [x["observation"]["id"] for x in lines if "observation" in x]
    assert ids == [f"w1-{i}" for i in (0, 1, 2, 3, 4, 10, 11)] + [f"w3-{i}" for i in range(5)]
    r = await api.get("/v1/admin/audit", params={"limit": 1000})
    actions = [e["action"] for e in r.json()["entries"]]
    assert actions.count("coldstore.segment_failed") >= 3


async def test_the_service_alone_cannot_decrypt(api: Api, cold_key: Key) -> None:
    """Everything the service stores about the key (public key, tag) does not open a segment:
    no private key is anywhere in SQL, and a key derived from what is stored fails."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from service.db.models import ColdStoreKey

    name = await _sealed(api)
    async with api.ctx.sessionmaker() as s:
        row = await s.get(ColdStoreKey, cold_key.id)
        seg = (await s.scalars(select(ColdSegment).join(Stream).where(Stream.name == name))).first()
    assert row is not None and seg is not None
    data = Path(seg.path).read_bytes()
    for guess in (row.public_key, row.verification_tag):
        with pytest.raises(crypto.SegmentError):
            crypto.open_segment(data, X25519PrivateKey.from_private_bytes(guess))
    real = crypto.combine(cold_key.shares[:2], public_key=row.public_key, tag=row.verification_tag)
    assert crypto.private_key_bytes(real) not in (await _all_sql_bytes(api))


async def _all_sql_bytes(api: Api) -> bytes:
    from sqlalchemy import text

    from service.db.models import Base

    out = []
    async with api.ctx.sessionmaker() as s:
        for t in Base.metadata.sorted_tables:
            for row in (await s.execute(text(f'SELECT * FROM "{t.name}"'))).all():
                out += [v if isinstance(v, bytes) else str(v).encode() for v in row]
    return b"|".join(out)


async def test_request_validation(api: Api, cold_key: Key) -> None:
    name = await _sealed(api)
    bad = [
        ({"stream": name, "justification": "long enough reason"}, "either"),
        (
            {
                "stream": name,
                "from_window": 2,
                "to_window": 1,
                "justification": "long enough reason",
            },
            "from_window",
        ),
        (
            {"stream": name, "from_window": 1, "to_window": 2, "justification": "short"},
            "justification",
        ),
        (
            {
                "stream": name,
                "from_window": 1,
                "to_window": 2,
                "justification": "long enough reason",
                "ttl_seconds": 10**6,
            },
            "ttl_seconds",
        ),
    ]
    for body, word in bad:
        r = await api.post("/v1/admin/unlock-requests", "analyst", json=body)
        assert r.status_code == 422 and word in r.json()["detail"], r.text
    r = await api.post(
        "/v1/admin/unlock-requests",
        "analyst",
        json={
            "stream": "nope",
            "from_window": 1,
            "to_window": 1,
            "justification": "long enough reason",
        },
    )
    assert r.status_code == 404
    r = await api.post(
        "/v1/admin/unlock-requests",
        "producer",
        json={
            "stream": name,
            "from_window": 1,
            "to_window": 1,
            "justification": "long enough reason",
        },
    )
    assert r.status_code == 403


async def test_time_ranges(api: Api, cold_key: Key) -> None:
    name = await _sealed(api)
    now = datetime.now(UTC)
    req = await _request(
        api,
        name,
        from_window=None,
        to_window=None,
        from_time=(now - timedelta(hours=1)).isoformat(),
        to_time=(now + timedelta(hours=1)).isoformat(),
    )
    a1, a2 = await _admins(api, 2)
    await _approve(api, req["id"], a1, cold_key.shares[0])
    await _approve(api, req["id"], a2, cold_key.shares[1])
    r = await api.get(f"/v1/admin/unlock-requests/{req['id']}/export", "analyst")
    assert len(r.content.splitlines()) == 24
    r = await api.get(
        f"/v1/admin/unlock-requests/{req['id']}/export",
        "analyst",
        params={"from_time": (now - timedelta(hours=2)).isoformat()},
    )
    assert r.status_code == 403
