from __future__ import annotations

from fastapi import APIRouter, Path

from service.api.deps import AdminKey, AnyKey, CtxDep, JsonRoute, SessionDep
from service.audit import service as audit
from service.errors import Conflict, NotFound, ValidationError, error_responses
from service.lifecycle import streams as lifecycle_streams
from service.streams import service
from service.streams.schemas import NAME_PATTERN, StreamCreate, StreamList, StreamOut

router = APIRouter(prefix="/v1/streams", tags=["streams"], route_class=JsonRoute)
StreamPath = Path(pattern=NAME_PATTERN, max_length=64)


@router.post(
    "",
    status_code=201,
    response_model=StreamOut,
    responses=error_responses(Conflict, ValidationError),
)
async def create_stream(body: StreamCreate, ctx: CtxDep, who: AdminKey) -> StreamOut:
    """Register a stream. Its rows are written in short transactions of their own, around the
    preparation of its first windows in Redis (no SQL transaction waits on Redis)."""
    out = await lifecycle_streams.create(ctx=ctx, stream_in=body)
    await audit.record(
        ctx.sessionmaker,
        actor=who.key_id,
        action="stream.create",
        target=f"stream:{out.name}",
        detail={"config": body.model_dump(mode="json", exclude={"name"})},
    )
    return out


@router.get("", response_model=StreamList)
async def list_streams(session: SessionDep, _: AnyKey) -> StreamList:
    """The streams, oldest first, with their settings and state."""
    return StreamList(streams=await service.list_out(session=session))


@router.get("/{stream}", response_model=StreamOut, responses=error_responses(NotFound))
async def get_stream(session: SessionDep, _: AnyKey, stream: str = StreamPath) -> StreamOut:
    """One stream: its settings, its privacy configuration and its state (``creating`` until
    its tables and keys exist, then ``ready``; 503 from the other operations until then)."""
    return await service.get_out(session=session, name=stream)
