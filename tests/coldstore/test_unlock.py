"""Break-glass unlock over HTTP (docs/ARCHITECTURE.md, "Cold store and break-glass unlock"):
request, approvals with shares, grant, export of
the requested range only, expiry and close; refusals; tamper detection at export."""

from __future__ import annotations

import asyncio
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from sqlalchemy import select, update

from service.coldstore import crypto, unlock
from service.coldstore import service as coldstore
from service.db.models import ColdSegment, Stream, UnlockApproval, UnlockRequest
from tests.coldstore.conftest import Key, rows, sealed_stream, segments
from tests.conftest import Api


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
    a1, a2 = await api.add_keys(a1="admin", a2="admin")
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
    assert lines.pop()["manifest"]["rows"] == 19  # the last line: the manifest
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
    assert not api.ctx.vault.grants
    r = await api.get(f"/v1/admin/unlock-requests/{req['id']}/export", "analyst")
    assert r.status_code == 409


async def test_refusals_wrong_duplicate_and_too_few_shares(api: Api, cold_key: Key) -> None:
    name = await _sealed(api)
    req = await _request(api, name)
    rid = req["id"]
    a1, a2, a3 = await api.add_keys(a1="admin", a2="admin", a3="admin")
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
    a1, a2 = await api.add_keys(a1="admin", a2="admin")
    await _approve(api, req["id"], a1, cold_key.shares[0])
    assert (await _approve(api, req["id"], a2, cold_key.shares[1])).json()["status"] == "granted"
    async with api.ctx.sessionmaker() as s, s.begin():  # the clock moves past the TTL
        await s.execute(
            update(UnlockRequest)
            .where(UnlockRequest.id == req["id"])
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    api.ctx.vault.grants[req["id"]].expires_at = datetime.now(UTC) - timedelta(seconds=1)
    r = await api.get(f"/v1/admin/unlock-requests/{req['id']}/export", "analyst")
    assert r.status_code == 409 and "expired" in r.json()["detail"]
    assert req["id"] not in api.ctx.vault.grants


async def test_tampered_segments_are_reported_and_the_export_goes_on(
    api: Api, cold_key: Key
) -> None:
    name = await _sealed(api)
    segs = await segments(api.ctx, name)
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
    a1, a2 = await api.add_keys(a1="admin", a2="admin")
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
        to_time=(now + timedelta(minutes=1)).isoformat(),  # within the clock skew allowed
    )
    a1, a2 = await api.add_keys(a1="admin", a2="admin")
    await _approve(api, req["id"], a1, cold_key.shares[0])
    await _approve(api, req["id"], a2, cold_key.shares[1])
    r = await api.get(f"/v1/admin/unlock-requests/{req['id']}/export", "analyst")
    assert len(r.content.splitlines()) == 24 + 1  # the rows and the manifest
    r = await api.get(
        f"/v1/admin/unlock-requests/{req['id']}/export",
        "analyst",
        params={"from_time": (now - timedelta(hours=2)).isoformat()},
    )
    assert r.status_code == 403


async def _approvals(api: Api, rid: str) -> int:
    r = await api.get(f"/v1/admin/unlock-requests/{rid}", "analyst")
    assert r.status_code == 200, r.text
    return int(r.json()["approvals"])


async def test_a_pending_share_is_wiped_when_its_ttl_runs_out(
    api: Api, cold_key: Key, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shares wait for the threshold at most ``unlock_share_ttl_seconds``: then the API
    process's timer wipes the share from memory, unprompted, and its approval is withdrawn; the
    threshold needs fresh shares."""
    monkeypatch.setattr(api.ctx.settings, "unlock_share_ttl_seconds", 1)
    name = await _sealed(api)
    rid = (await _request(api, name))["id"]
    a1, a2, a3 = await api.add_keys(a1="admin", a2="admin", a3="admin")
    r = await _approve(api, rid, a1, cold_key.shares[0])
    assert r.json()["status"] == "pending"
    held = api.ctx.vault.pending[rid]
    share = next(iter(held.values()))
    assert share.value == cold_key.shares[0]
    await asyncio.sleep(1.3)  # no call in between: the timer alone wipes it
    assert share.value is None and rid not in api.ctx.vault.pending
    assert await _approvals(api, rid) == 0  # withdrawn in SQL too
    r = await _approve(api, rid, a2, cold_key.shares[1])
    assert r.json()["status"] == "pending" and r.json()["approvals"] == 1
    r = await _approve(api, rid, a3, cold_key.shares[2])
    assert r.json()["status"] == "granted", r.text
    assert rid not in api.ctx.vault.pending
    entries = (await api.get("/v1/admin/audit", params={"limit": 1000})).json()["entries"]
    expired = [e for e in entries if e["action"] == "unlock.shares_expired"]
    assert [e["target"] for e in expired] == [f"unlock:{rid}"]


async def test_the_expiry_job_withdraws_stale_approvals_and_wipes_their_shares(
    api: Api, cold_key: Key
) -> None:
    """The ``unlock_expire_grants`` job: approvals past the TTL are withdrawn in SQL (whichever
    process runs it) and their shares wiped from this process; younger ones stay. A share
    whose approval another process withdrew is dropped at the next approval."""
    ttl = api.ctx.settings.unlock_share_ttl_seconds
    assert ttl == 900  # the documented default
    name = await _sealed(api)
    old_rid = (await _request(api, name))["id"]
    young_rid = (await _request(api, name))["id"]
    a1, a2 = await api.add_keys(a1="admin", a2="admin")
    await _approve(api, old_rid, a1, cold_key.shares[0])
    await _approve(api, young_rid, a1, cold_key.shares[0])
    past = datetime.now(UTC) - timedelta(seconds=ttl + 1)
    async with api.ctx.sessionmaker() as s, s.begin():  # the clock moves past the TTL
        await s.execute(
            update(UnlockApproval)
            .where(UnlockApproval.request_id == old_rid)
            .values(created_at=past)
        )
    old_share = next(iter(api.ctx.vault.pending[old_rid].values()))
    old_share.expires_at = past + timedelta(seconds=ttl)
    await unlock.expire_grants(ctx=api.ctx)
    assert old_rid not in api.ctx.vault.pending and old_share.value is None
    assert await _approvals(api, old_rid) == 0
    assert len(api.ctx.vault.pending[young_rid]) == 1 and await _approvals(api, young_rid) == 1
    # another process (the standalone worker) withdrew the young approval in SQL: the share
    # this process still holds no longer counts towards the threshold
    async with api.ctx.sessionmaker() as s, s.begin():
        await s.execute(
            update(UnlockApproval)
            .where(UnlockApproval.request_id == young_rid)
            .values(created_at=past)
        )
    saved = api.ctx.vault.pending.pop(young_rid)  # as if the job ran in another process
    await unlock.expire_grants(ctx=api.ctx)
    api.ctx.vault.pending[young_rid] = saved
    r = await _approve(api, young_rid, a2, cold_key.shares[1])
    assert r.json()["status"] == "pending" and r.json()["approvals"] == 1, r.text
    assert [s.value for s in api.ctx.vault.pending[young_rid].values()] == [cold_key.shares[1]]
