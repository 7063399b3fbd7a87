from __future__ import annotations

from fastapi import APIRouter, Query

from service.api.deps import AdminKey, AnyKey, CtxDep, JsonRoute, SessionDep
from service.api.streams import StreamPath
from service.audit import service as audit
from service.errors import NotFound, error_responses
from service.lifecycle.roll import roll as roll_stream
from service.windows import service
from service.windows.schemas import RollOut, WindowsOut

router = APIRouter(prefix="/v1/streams", tags=["windows"], route_class=JsonRoute)


@router.get("/{stream}/windows", response_model=WindowsOut, responses=error_responses(NotFound))
async def list_windows(
    ctx: CtxDep,
    session: SessionDep,
    _: AnyKey,
    stream: str = StreamPath,
    limit: int = Query(default=100, ge=1, le=1000),
) -> WindowsOut:
    """The stream's windows and their states (observation counts of hot windows only)."""
    return await service.list_windows(ctx=ctx, session=session, name=stream, limit=limit)


@router.post("/{stream}/roll", response_model=RollOut, responses=error_responses(NotFound))
async def roll(ctx: CtxDep, who: AdminKey, stream: str = StreamPath) -> RollOut:
    """Close the open window now, as the schedule would: → ``{"epoch"}`` of the new tables."""
    epoch = await roll_stream(ctx=ctx, name=stream)
    await audit.record(
        ctx.sessionmaker,
        actor=who.key_id,
        action="stream.forced_roll",
        target=f"stream:{stream}",
        detail={"epoch": epoch},
    )
    return RollOut(epoch=epoch)
