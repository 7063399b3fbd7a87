from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query

from service.deps import AdminKey, AnyKey, CtxDep, SessionDep
from service.errors import NotFound, error_responses
from service.streams import repository
from service.streams import service as streams
from service.streams.router import StreamPath
from service.windows import service
from service.windows.schemas import RollOut, WindowOut, WindowsOut

router = APIRouter(prefix="/v1/streams", tags=["windows"])


@router.get("/{stream}/windows", response_model=WindowsOut, responses=error_responses(NotFound))
async def list_windows(
    ctx: CtxDep,
    session: SessionDep,
    _: AnyKey,
    stream: str = StreamPath,
    limit: int = Query(default=100, ge=1, le=1000),
) -> WindowsOut:
    row = await streams.get(session=session, name=stream)
    rt = await streams.runtime(ctx=ctx, name=stream)
    hot = rt.hot_period(row.epoch)
    count = rt.count_period(row.epoch)

    def period(e: int) -> str:
        if e == row.epoch:
            return "open"
        if hot[0] <= e <= hot[1]:
            return "hot"
        return "count" if count[0] <= e <= count[1] else "expired"

    ws = await repository.windows_of(session, row.id, limit=limit)
    return WindowsOut(
        epoch=row.epoch,
        served_epoch=await service.store_of(ctx).served(stream),
        hot_period=hot,
        count_period=(max(count[0], 1), count[1]),
        windows=[
            WindowOut(
                epoch=w.epoch,
                state=w.state,
                period=period(w.epoch),
                observations=w.observations,
                opened_at=w.opened_at,
                closed_at=w.closed_at,
                cold_sealed_at=w.cold_sealed_at,
                hot_deleted_at=w.hot_deleted_at,
                expired_at=w.expired_at,
            )
            for w in ws
        ],
    )


@router.post("/{stream}/roll", response_model=RollOut, responses=error_responses(NotFound))
async def roll(ctx: CtxDep, _: AdminKey, stream: str = StreamPath) -> RollOut:
    epoch = await service.roll(ctx=ctx, name=stream)
    task = asyncio.create_task(service.prepare_next(ctx=ctx, name=stream))
    tasks: set = ctx.caches.setdefault("background", set())
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return RollOut(epoch=epoch)
