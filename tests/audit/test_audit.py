"""The hash-chained audit log: privileged actions are recorded; `verify` finds the first
edited, removed or reordered entry."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select, update

from service.audit import service as audit
from service.context import AppContext
from service.db.models import AuditEntry
from tests.conftest import Api, unique
from tests.helpers import stream_body


async def _fresh_chain(ctx: AppContext, n: int) -> list[int]:
    """This test's own entries; the log is shared by the session, so verify the whole log."""
    return [
        await audit.record(
            ctx.sessionmaker, actor="t", action="test.step", target=str(i), detail={"i": i}
        )
        for i in range(n)
    ]


async def _verify(ctx: AppContext) -> audit.Verdict:
    async with ctx.sessionmaker() as s:
        return await audit.verify(s)


async def test_privileged_actions_are_recorded_over_http(api: Api) -> None:
    name = unique("aud")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    r = await api.post("/v1/admin/keys", json={"role": "producer", "name": "ingest-bot"})
    assert r.status_code == 201
    page = (await api.get("/v1/admin/audit", params={"limit": 1000})).json()["entries"]
    mine = [(e["action"], e["target"]) for e in page]
    assert ("stream.create", f"stream:{name}") in mine
    assert ("stream.forced_roll", f"stream:{name}") in mine
    assert ("admin.create_key", f"key:{r.json()['id']}") in mine
    assert r.json()["key"] not in str(page)  # the key itself is never logged
    assert (await api.get("/v1/admin/audit", "analyst")).status_code == 403
    assert (await _verify(api.ctx)).ok


async def test_queue_creation_and_label_exports_are_recorded(api: Api) -> None:
    name = unique("audq")
    body = {"name": name, "beta": 0.1, "k": 10, "labels": ["0", "1"], "payload_kind": "text"}
    assert (await api.post("/v1/queues", json=body)).status_code == 201, body
    r = await api.get(f"/v1/queues/{name}/labels", params={"limit": 50})
    assert r.status_code == 200
    page: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:  # the session's log may be long: read it to the end
        got = (await api.get("/v1/admin/audit", params={"limit": 1000, "after": after})).json()
        page, after = page + got["entries"], got["next_after"]
    mine = {(e["action"], e["target"]): e for e in page}
    created = mine[("queue.create", f"queue:{name}")]
    assert created["detail"]["config"]["beta"] == 0.1 and created["detail"]["config"]["k"] == 10
    assert created["detail"]["delta"] > 0 and created["key_version"] == 1
    export = mine[("queue.export_labels", f"queue:{name}")]
    assert export["detail"] == {"after": 0, "limit": 50, "exported": 0}
    assert (await _verify(api.ctx)).ok


async def test_an_edited_entry_is_found(ctx: AppContext) -> None:
    seqs = await _fresh_chain(ctx, 5)
    assert (await _verify(ctx)).ok
    async with ctx.sessionmaker() as s, s.begin():
        await s.execute(
            update(AuditEntry).where(AuditEntry.seq == seqs[2]).values(detail={"i": 99})
        )
    v = await _verify(ctx)
    assert not v.ok and v.first_bad_seq == seqs[2] and "edited" in (v.problem or "")
    async with ctx.sessionmaker() as s, s.begin():  # put it back for the tests that follow
        await s.execute(update(AuditEntry).where(AuditEntry.seq == seqs[2]).values(detail={"i": 2}))
    assert (await _verify(ctx)).ok


async def test_a_removed_entry_is_found(ctx: AppContext) -> None:
    seqs = await _fresh_chain(ctx, 4)
    async with ctx.sessionmaker() as s, s.begin():
        row = await s.get(AuditEntry, seqs[1])
        assert row is not None
        saved = {c.name: getattr(row, c.name) for c in AuditEntry.__table__.columns}
        await s.execute(delete(AuditEntry).where(AuditEntry.seq == seqs[1]))
    v = await _verify(ctx)
    assert not v.ok and v.first_bad_seq == seqs[1] and "missing" in (v.problem or "")
    async with ctx.sessionmaker() as s, s.begin():
        s.add(AuditEntry(**saved))
    assert (await _verify(ctx)).ok


async def test_reordered_entries_are_found(ctx: AppContext) -> None:
    seqs = await _fresh_chain(ctx, 4)
    async with ctx.sessionmaker() as s, s.begin():  # swap the contents of two entries
        a = await s.get(AuditEntry, seqs[1])
        b = await s.get(AuditEntry, seqs[2])
        assert a is not None and b is not None
        cols = ["ts", "actor", "action", "target", "detail", "prev_hash", "hash"]
        va, vb = ({c: getattr(x, c) for c in cols} for x in (a, b))
        for c in cols:
            setattr(a, c, vb[c])
            setattr(b, c, va[c])
    v = await _verify(ctx)
    assert not v.ok and v.first_bad_seq == seqs[1]
    async with ctx.sessionmaker() as s, s.begin():
        a = await s.get(AuditEntry, seqs[1])
        b = await s.get(AuditEntry, seqs[2])
        assert a is not None and b is not None
        for c in cols:
            setattr(a, c, va[c])
            setattr(b, c, vb[c])
    assert (await _verify(ctx)).ok


async def test_concurrent_appends_keep_one_chain(ctx: AppContext) -> None:
    import asyncio

    seqs = await asyncio.gather(
        *[
            audit.record(ctx.sessionmaker, actor="t", action="test.concurrent", target=str(i))
            for i in range(20)
        ]
    )
    assert len(set(seqs)) == 20 and max(seqs) - min(seqs) == 19
    assert (await _verify(ctx)).ok
    async with ctx.sessionmaker() as s:
        n = len(
            list(
                await s.scalars(
                    select(AuditEntry.seq).where(AuditEntry.action == "test.concurrent")
                )
            )
        )
    assert n >= 20
