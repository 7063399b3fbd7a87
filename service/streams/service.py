"""Rules of streams: reading, the runtime cache (creation, which prepares the first windows,
is ``service.lifecycle.streams``)."""

from __future__ import annotations

import time

from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core.dp.budget import budget_split
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.streamconfig import StreamCreate
from service.db.models import CountTable, Stream
from service.errors import NotFound
from service.streams import repository
from service.streams.schemas import StreamOut, TableOut

RUNTIME_TTL_SECONDS = 5.0


def runtime_of(stream: Stream, tables: list[CountTable]) -> StreamRuntime:
    return StreamRuntime(
        id=stream.id,
        name=stream.name,
        config=StreamCreate.model_validate(stream.config),
        hash_seed=stream.hash_seed,
        tables=tuple(
            TableRef(t.id, t.name, tuple(t.features), t.first_epoch, t.reason) for t in tables
        ),
    )


def to_out(stream: Stream, tables: list[CountTable] | tuple) -> StreamOut:
    rt = runtime_of(stream, list(tables))
    return StreamOut.model_validate(
        {
            **rt.config.model_dump(),
            "epoch": stream.epoch,
            "epoch_started_at": stream.epoch_started_at,
            "created_at": stream.created_at,
            "noise_scale": rt.noise.scale,
            "l1_sensitivity": rt.noise.l1_sensitivity,
            "l2_sensitivity": rt.noise.l2_sensitivity,
            "budget": budget_split(rt.config),
            "tables": [TableOut.model_validate(t, from_attributes=True) for t in tables],
        }
    )


async def get(*, session: AsyncSession, name: str) -> Stream:
    stream = await repository.get_by_name(session, name)
    if stream is None:
        raise NotFound(f"stream {name!r} not found")
    return stream


async def get_out(*, session: AsyncSession, name: str) -> StreamOut:
    stream = await get(session=session, name=name)
    return to_out(stream, list(await repository.tables_of(session, stream.id)))


async def list_out(*, session: AsyncSession) -> list[StreamOut]:
    return [
        to_out(s, list(await repository.tables_of(session, s.id)))
        for s in await repository.list_streams(session)
    ]


async def runtime(*, ctx: AppContext, name: str) -> StreamRuntime:
    """The stream's runtime, cached per process for a few seconds (streams change rarely:
    only when tables are added, from a later window on)."""
    cache = ctx.caches.runtimes
    hit = cache.get(name)
    now = time.monotonic()
    if hit is not None and now - hit[0] < RUNTIME_TTL_SECONDS:
        return hit[1]
    async with ctx.sessionmaker() as session:
        stream = await get(session=session, name=name)
        rt = runtime_of(stream, list(await repository.tables_of(session, stream.id)))
    cache[name] = (now, rt)
    return rt


def forget_runtime(ctx: AppContext, name: str) -> None:
    ctx.caches.runtimes.pop(name, None)
