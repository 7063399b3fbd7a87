"""Break-glass unlock over HTTP (docs/ARCHITECTURE.md, "Cold store and break-glass unlock"):
analysts request and export, admins approve."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse

from service.admin.service import Principal
from service.api.deps import AdminKey, CtxDep, JsonRoute, require
from service.coldstore import unlock
from service.coldstore.schemas import (
    MAX_LIST_LIMIT,
    MAX_WINDOW,
    WINDOW_RANGE,
    ApproveIn,
    ExportFormat,
    UnlockRequestIn,
    UnlockRequestOut,
    UnlockRequestPage,
    UnlockStatus,
)
from service.errors import (
    Conflict,
    Forbidden,
    NotFound,
    Unavailable,
    ValidationError,
    error_responses,
)

router = APIRouter(prefix="/v1/admin/unlock-requests", tags=["unlock"], route_class=JsonRoute)
AnalystKey = Annotated[Principal, Depends(require("analyst"))]
ERRORS = error_responses(Forbidden, NotFound, Conflict, ValidationError)


@router.post(
    "",
    status_code=201,
    response_model=UnlockRequestOut,
    responses=error_responses(NotFound, ValidationError, Unavailable),
)
async def create(body: UnlockRequestIn, ctx: CtxDep, who: AnalystKey) -> UnlockRequestOut:
    """File a request for a stream's raw data: windows or a time range, and why."""
    return await unlock.create_request(ctx=ctx, who=who, body=body)


@router.get("", response_model=UnlockRequestPage, responses=error_responses(ValidationError))
async def list_requests(
    ctx: CtxDep,
    who: AnalystKey,
    status: Annotated[
        UnlockStatus | None,
        Query(description="pending, granted, or closed (closed and expired); all if omitted"),
    ] = None,
    limit: Annotated[
        int, Query(ge=1, le=MAX_LIST_LIMIT, description=f"1 <= limit <= {MAX_LIST_LIMIT}")
    ] = 50,
    before: Annotated[
        str | None,
        Query(max_length=32, description="the next_before of the previous page"),
    ] = None,
) -> UnlockRequestPage:
    """Unlock requests, newest first: every request for an admin, an analyst's own for an
    analyst (the console's break-glass page lists them)."""
    return await unlock.list_requests(
        ctx=ctx,
        status=status,
        limit=limit,
        before=before,
        requested_by=None if who.role == "admin" else who.key_id,
    )


@router.get("/{request_id}", response_model=UnlockRequestOut, responses=ERRORS)
async def status(request_id: str, ctx: CtxDep, who: AnalystKey) -> UnlockRequestOut:
    """An unlock request: its approvals, threshold, range of windows and the grant's state."""
    return await unlock.get(ctx=ctx, who=who, rid=request_id[:32])


@router.post("/{request_id}/approve", response_model=UnlockRequestOut, responses=ERRORS)
async def approve(request_id: str, body: ApproveIn, ctx: CtxDep, who: AdminKey) -> UnlockRequestOut:
    """One admin's approval with their SLIP-39 share. The share is held in this process's
    memory only; at the threshold the key is rebuilt, checked, and the grant opens."""
    return await unlock.approve(ctx=ctx, who=who, rid=request_id[:32], share=body.share)


@router.post("/{request_id}/close", response_model=UnlockRequestOut, responses=ERRORS)
async def close(request_id: str, ctx: CtxDep, who: AnalystKey) -> UnlockRequestOut:
    """End the grant now; the key is wiped."""
    return await unlock.close(ctx=ctx, who=who, rid=request_id[:32])


@router.get("/{request_id}/export", responses=ERRORS)
async def export(
    request_id: str,
    ctx: CtxDep,
    who: AnalystKey,
    format: Annotated[ExportFormat, Query()] = "ndjson",  # noqa: A002
    from_window: Annotated[int | None, Query(ge=1, le=MAX_WINDOW, description=WINDOW_RANGE)] = None,
    to_window: Annotated[int | None, Query(ge=1, le=MAX_WINDOW, description=WINDOW_RANGE)] = None,
    from_time: datetime | None = None,
    to_time: datetime | None = None,
) -> StreamingResponse:
    """The decrypted observations of the granted range (or a part of it), NDJSON or Arrow IPC.
    A segment that fails its checks is reported in the stream (an ``error`` row) and the
    export goes on with the next one. The last record is the manifest (NDJSON: a
    ``{"manifest": ...}`` line; Arrow: the custom metadata ``manifest`` of an empty last batch):
    rows per window, counted from the decrypted segments, and the windows of the range not
    (yet) sealed, which the export does not hold."""
    body = await unlock.export(
        ctx=ctx,
        who=who,
        rid=request_id[:32],
        fmt=format,
        from_window=from_window,
        to_window=to_window,
        from_time=from_time,
        to_time=to_time,
    )
    media = "application/x-ndjson" if format == "ndjson" else "application/vnd.apache.arrow.stream"
    return StreamingResponse(body, media_type=media)
