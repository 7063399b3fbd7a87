from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import AnyKey, CtxDep, JsonRoute, SessionDep
from service.api.streams import StreamPath
from service.errors import NotFound, error_responses
from service.selection import service
from service.streams import service as streams
from service.streams.schemas import TableOut, TablesOut

router = APIRouter(prefix="/v1/streams", tags=["tables"], route_class=JsonRoute)


@router.get("/{stream}/tables", response_model=TablesOut, responses=error_responses(NotFound))
async def tables(
    ctx: CtxDep, session: SessionDep, _: AnyKey, stream: str = StreamPath
) -> TablesOut:
    """The stream's count tables and the groups DP selection picked for them."""
    rows = await service.list_tables(session=session, name=stream)
    rt = await streams.runtime(ctx=ctx, name=stream)
    return TablesOut(
        stream=stream,
        max_tables=rt.config.max_tables or 0,
        tables=[TableOut.model_validate(t, from_attributes=True) for t in rows],
    )
