from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field
from sqlalchemy import select

from service.api.deps import INT64_MAX, AdminKey, JsonRoute, SessionDep
from service.audit import service
from service.db.models import AuditEntry
from service.errors import Unavailable, error_responses

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=JsonRoute)


class AuditEntryOut(BaseModel):
    seq: int
    ts: datetime
    actor: str
    action: str
    target: str
    detail: dict[str, Any]
    prev_hash: str
    hash: str = Field(description="HMAC-SHA256 under the audit key (key_version 1) or SHA-256 (0)")
    key_version: int = Field(description="0: plain SHA-256, written before the audit key; 1: keyed")


class AuditPage(BaseModel):
    entries: list[AuditEntryOut]
    next_after: int | None


@router.get("/audit", response_model=AuditPage)
async def audit_log(
    session: SessionDep,
    _: AdminKey,
    after: Annotated[int, Query(ge=0, le=INT64_MAX, description="entries with seq > after")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> AuditPage:
    """The audit log, oldest first after ``after`` (a keyed hash chain; ``key_version`` 0:
    plain SHA-256 entries from before the key)."""
    rows = await service.page(session, after=after, limit=limit)
    return AuditPage(
        entries=[_entry_out(e) for e in rows],
        next_after=rows[-1].seq if len(rows) == limit else None,
    )


class AuditRecentPage(BaseModel):
    entries: list[AuditEntryOut]
    next_before: int | None = Field(description="pass as ``before`` for the next (older) page")


def _entry_out(e: Any) -> AuditEntryOut:
    return AuditEntryOut(
        seq=e.seq,
        ts=e.ts,
        actor=e.actor,
        action=e.action,
        target=e.target,
        detail=e.detail,
        prev_hash=e.prev_hash.hex(),
        hash=e.hash.hex(),
        key_version=e.key_version,
    )


@router.get("/audit/recent", response_model=AuditRecentPage)
async def audit_recent(
    session: SessionDep,
    _: AdminKey,
    before: Annotated[
        int | None, Query(ge=1, le=INT64_MAX, description="entries with seq < before")
    ] = None,
    action: Annotated[str | None, Query(max_length=64, description="exact action")] = None,
    actor: Annotated[str | None, Query(max_length=64, description="exact actor (key id)")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> AuditRecentPage:
    """The log newest first (the console's audit page), optionally of one action or actor."""
    q = select(AuditEntry)
    if before is not None:
        q = q.where(AuditEntry.seq < before)
    if action:
        q = q.where(AuditEntry.action == action)
    if actor:
        q = q.where(AuditEntry.actor == actor)
    rows = list(await session.scalars(q.order_by(AuditEntry.seq.desc()).limit(limit)))
    return AuditRecentPage(
        entries=[_entry_out(e) for e in rows],
        next_before=rows[-1].seq if len(rows) == limit else None,
    )


class AnchorOut(BaseModel):
    seq: int
    hash: str
    keyed_from: int
    key_id: str


class VerifyOut(BaseModel):
    ok: bool
    entries: int
    head_seq: int = Field(description="the last entry whose chain checked out")
    head_hash: str = Field(description="note SEQ:HASH outside the database (--expect-head)")
    first_bad_seq: int | None
    problem: str | None
    keyed_from: int | None
    key_id: str | None
    anchor: AnchorOut | None
    notes: list[str]


@router.get("/audit/verify", response_model=VerifyOut, responses=error_responses(Unavailable))
async def audit_verify(
    session: SessionDep,
    _: AdminKey,
    expect_head: Annotated[
        str | None,
        Query(
            pattern=r"^[1-9][0-9]{0,17}:[0-9a-fA-F]{64}$",
            description="SEQ:HASH, a head noted earlier outside the database",
        ),
    ] = None,
) -> VerifyOut:
    """``selectivity audit verify`` over HTTP: walk the chain, check it against the anchor
    (and ``expect_head``). It reads the whole log, so it is for admins only."""
    expect = None
    if expect_head is not None:
        seq, digest = expect_head.split(":")
        expect = (int(seq), bytes.fromhex(digest))
    try:
        v = await service.verify(session, expect_head=expect)
    except service.AuditSetupError as exc:
        raise Unavailable(str(exc)) from None
    a = v.anchor
    return VerifyOut(
        ok=v.ok,
        entries=v.entries,
        head_seq=v.head_seq,
        head_hash=v.head_hash,
        first_bad_seq=v.first_bad_seq,
        problem=v.problem,
        keyed_from=v.keyed_from,
        key_id=v.key_id,
        anchor=AnchorOut(seq=a.seq, hash=a.hash.hex(), keyed_from=a.keyed_from, key_id=a.key_id)
        if a
        else None,
        notes=list(v.notes),
    )
