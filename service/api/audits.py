"""Re-identification audits: roles analyst and admin, every creation audited; an audit is read
only by the key that created it (docs/ARCHITECTURE.md, "Re-identification audits")."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path

from service.admin.service import Principal
from service.api.deps import CtxDep, JsonRoute, require
from service.audit import service as audit_log
from service.audits import service
from service.audits.schemas import ID_PATTERN, AuditCreate, AuditCreatedOut, AuditOut
from service.errors import Conflict, NotFound, TooManyRequests, ValidationError, error_responses

router = APIRouter(prefix="/v1/audits/reidentification", tags=["audits"], route_class=JsonRoute)
AnalystKey = Annotated[Principal, Depends(require("analyst"))]
IdPath = Path(pattern=ID_PATTERN)


@router.post(
    "",
    status_code=202,
    response_model=AuditCreatedOut,
    responses=error_responses(NotFound, ValidationError, Conflict, TooManyRequests),
)
async def create(body: AuditCreate, ctx: CtxDep, who: AnalystKey) -> AuditCreatedOut:
    """Start an audit: the attacks of ``service.core.reidentification.attacks`` against the release;
    poll ``GET``
    for its progress and results."""
    async with ctx.jobs.admission(owner=who.key_id):  # 429 when the user jobs are full
        a, detail = await service.create(ctx=ctx, body=body, owner=who.key_id)
    await audit_log.record(
        ctx.sessionmaker,
        actor=who.key_id,
        action="reidentification.create",
        target=f"reidentification:{a}",
        detail=detail,
    )
    return AuditCreatedOut(id=a)


@router.get("/{a}", response_model=AuditOut, responses=error_responses(NotFound))
async def get(ctx: CtxDep, who: AnalystKey, a: str = IdPath) -> AuditOut:
    """Status, progress and results of an audit this key created (any other id: 404)."""
    return await service.get(ctx=ctx, a=a, owner=who.key_id)
