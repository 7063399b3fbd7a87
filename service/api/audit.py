from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from service.api.deps import INT64_MAX, AdminKey, JsonRoute, SessionDep
from service.audit import service

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
    rows = await service.page(session, after=after, limit=limit)
    return AuditPage(
        entries=[
            AuditEntryOut(
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
            for e in rows
        ],
        next_after=rows[-1].seq if len(rows) == limit else None,
    )
