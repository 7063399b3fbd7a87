"""Break glass under concurrency and separation of duties (docs/ARCHITECTURE.md, "Cold store
and break-glass unlock"): approvals of one request are applied one at a time (no lost share,
one grant), and no key of the requester's actor approves its request."""

from __future__ import annotations

import asyncio

import pytest

from tests.coldstore.conftest import Key, rows, sealed_stream
from tests.conftest import Api


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _key(api: Api, role: str, actor: str | None = None) -> tuple[str, str]:
    """A new key of ``role`` (held by ``actor``) made over HTTP: (key, key id)."""
    body = {"role": role} | ({"actor": actor} if actor is not None else {})
    r = await api.post("/v1/admin/keys", json=body)
    assert r.status_code == 201, r.text
    return r.json()["key"], r.json()["id"]


async def _request(api: Api, name: str, key: str) -> str:
    body = {
        "stream": name,
        "from_window": 1,
        "to_window": 1,
        "justification": "incident 4711: audit a complaint",
    }
    r = await api.client.post("/v1/admin/unlock-requests", headers=_h(key), json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def _approve(api: Api, rid: str, key: str, share: str):  # type: ignore[no-untyped-def]
    return await api.client.post(
        f"/v1/admin/unlock-requests/{rid}/approve", headers=_h(key), json={"share": share}
    )


async def _audit(api: Api, rid: str, action: str) -> list[dict]:
    r = await api.get("/v1/admin/audit/recent", params={"action": action, "limit": 1000})
    return [e for e in r.json()["entries"] if e["target"] == f"unlock:{rid}"]


async def test_keys_name_their_actor_defaulting_to_their_id(api: Api) -> None:
    r = await api.post("/v1/admin/keys", json={"role": "analyst"})
    assert r.status_code == 201 and r.json()["actor"] == r.json()["id"]
    key, kid = await _key(api, "admin", "alice")
    me = (await api.client.get("/v1/whoami", headers=_h(key))).json()
    assert me["key_id"] == kid and me["actor"] == "alice"
    for bad, needle in (("", "actor"), ("x" * 201, "actor")):
        r = await api.post("/v1/admin/keys", json={"role": "admin", "actor": bad})
        assert r.status_code == 422 and needle in r.json()["detail"], r.text


@pytest.mark.parametrize("trial", range(4))
async def test_concurrent_approvals_grant_once_and_lose_no_share(
    api: Api, cold_key: Key, trial: int
) -> None:
    """Three admins approve a threshold-2 request at the same instant: exactly one answer is
    the grant, made of the first two shares; the third is told approvals are closed; no
    answer speaks of lost approvals."""
    name = await sealed_stream(api, [rows(3, f"t{trial}")])
    rid = await _request(api, name, api.keys["analyst"])
    admins = await api.add_keys(**{f"c{trial}a{i}": "admin" for i in range(3)})
    answers = await asyncio.gather(
        *(_approve(api, rid, a, s) for a, s in zip(admins, cold_key.shares, strict=True))
    )
    codes = sorted(r.status_code for r in answers)
    bodies = [r.json() for r in answers]
    assert codes == [200, 200, 409], bodies
    ok = [b for b in bodies if "status" in b]
    assert sorted(b["status"] for b in ok) == ["granted", "pending"], ok
    assert sorted(b["approvals"] for b in ok) == [1, 2]
    assert all(b.get("note") is None for b in ok), ok
    refused = next(b for b in bodies if "status" not in b)
    assert "granted; approvals are closed" in refused["detail"]
    st = (await api.get(f"/v1/admin/unlock-requests/{rid}")).json()
    assert st["status"] == "granted" and st["approvals"] == 2
    assert rid in api.ctx.vault.grants and rid not in api.ctx.vault.pending
    assert len(await _audit(api, rid, "unlock.grant")) == 1
    assert len(await _audit(api, rid, "unlock.approve")) == 2
    r = await api.get(f"/v1/admin/unlock-requests/{rid}/export", "analyst")
    assert r.status_code == 200


async def test_the_requester_cannot_approve_its_own_request(api: Api, cold_key: Key) -> None:
    """An admin files a request and offers its share: 403, audited; two other admins make
    the threshold, and only then can the requester export."""
    name = await sealed_stream(api, [rows(3, "self")])
    filer, filer_id = await _key(api, "admin")
    rid = await _request(api, name, filer)
    r = await _approve(api, rid, filer, cold_key.shares[0])
    assert r.status_code == 403 and r.json()["error"] == "SelfApproval", r.text
    assert "requester cannot approve its own request" in r.json()["detail"]
    st = (await api.get(f"/v1/admin/unlock-requests/{rid}")).json()
    assert st["status"] == "pending" and st["approvals"] == 0
    assert rid not in api.ctx.vault.pending  # the share was not kept
    [refusal] = await _audit(api, rid, "unlock.refused")
    assert refusal["actor"] == filer_id and refusal["detail"]["status"] == 403
    assert refusal["detail"]["rule"] == "separation_of_duties"
    assert refusal["detail"]["refused"] == "requester"
    a1, a2 = await api.add_keys(self_a1="admin", self_a2="admin")
    assert (await _approve(api, rid, a1, cold_key.shares[1])).json()["status"] == "pending"
    assert (await _approve(api, rid, a2, cold_key.shares[2])).json()["status"] == "granted"
    r = await api.client.get(f"/v1/admin/unlock-requests/{rid}/export", headers=_h(filer))
    assert r.status_code == 200


async def test_no_key_of_the_requesters_actor_approves(api: Api, cold_key: Key) -> None:
    """Alice files with her analyst key and tries to approve with her admin key: 403,
    audited; an actor's second key does not count twice either."""
    name = await sealed_stream(api, [rows(3, "actor")])
    analyst, _ = await _key(api, "analyst", "alice")
    admin, admin_id = await _key(api, "admin", "alice")
    rid = await _request(api, name, analyst)
    r = await _approve(api, rid, admin, cold_key.shares[0])
    assert r.status_code == 403 and r.json()["error"] == "SelfApproval", r.text
    assert "'alice', who filed this request" in r.json()["detail"]
    [refusal] = await _audit(api, rid, "unlock.refused")
    assert refusal["actor"] == admin_id and refusal["detail"]["refused"] == "requester_actor"
    bob1, _ = await _key(api, "admin", "bob")
    bob2, _ = await _key(api, "admin", "bob")
    assert (await _approve(api, rid, bob1, cold_key.shares[1])).json()["approvals"] == 1
    r = await _approve(api, rid, bob2, cold_key.shares[2])
    assert r.status_code == 409 and "'bob' has already approved" in r.json()["detail"]
    st = (await api.get(f"/v1/admin/unlock-requests/{rid}")).json()
    assert st["status"] == "pending" and st["approvals"] == 1
    carol, _ = await _key(api, "admin", "carol")
    assert (await _approve(api, rid, carol, cold_key.shares[2])).json()["status"] == "granted"
