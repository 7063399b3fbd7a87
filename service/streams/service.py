"""Rules of streams: creation (with its first windows' noise), reading, the runtime cache."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core.featurize import table_name
from service.db.models import CountTable, Stream
from service.errors import Conflict, NotFound, ValidationError
from service.streams import repository
from service.streams.runtime import StreamRuntime, TableRef, budget_split, noise_for
from service.streams.schemas import StreamCreate, StreamOut, TableOut

RUNTIME_TTL_SECONDS = 5.0
# Cells are int32: noise beyond ~1e7 would saturate them and carries no useful signal anyway.
MAX_NOISE_SCALE = 1e7


def _runtime(stream: Stream, tables: list[CountTable]) -> StreamRuntime:
    return StreamRuntime(
        id=stream.id,
        name=stream.name,
        config=StreamCreate.model_validate(stream.config),
        hash_seed=stream.hash_seed,
        tables=tuple(
            TableRef(t.id, t.name, tuple(t.features), t.first_epoch, t.reason) for t in tables
        ),
    )


async def create(*, ctx: AppContext, session: AsyncSession, stream_in: StreamCreate) -> StreamOut:
    from service.windows import service as windows

    if ctx.settings.env == "production" and stream_in.privacy.mechanism == "none":
        raise ValidationError("privacy.mechanism 'none' is refused in production")
    noise = noise_for(stream_in)
    largest = max(budget_split(stream_in), key=lambda row: row["noise_scale"])
    if largest["noise_scale"] > MAX_NOISE_SCALE:
        raise ValidationError(
            f"privacy: noise scale {largest['noise_scale']:.3g} of table {largest['table']!r} "
            f"(sensitivity {noise.l1_sensitivity:g} / budget, weighted) exceeds the limit of "
            f"{MAX_NOISE_SCALE:.0e}; raise epsilon/rho or its weight, or lower max_tables or "
            f"sketch.depth"
        )
    if await repository.get_by_name(session, stream_in.name) is not None:
        raise Conflict(f"stream {stream_in.name!r} already exists")
    now = datetime.now(UTC)
    stream = Stream(
        name=stream_in.name,
        config=stream_in.model_dump(mode="json"),
        hash_seed=secrets.token_bytes(32),
        epoch=1,
        epoch_started_at=now,
    )
    tables = [
        CountTable(name=table_name([f.name]), features=[f.name], first_epoch=1, reason="feature")
        for f in stream_in.features
    ]
    await repository.create(session, stream, tables)
    await repository.ensure_window(session, stream.id, 1, "open", now)
    rt = _runtime(stream, tables)
    await windows.forget_leftovers(ctx=ctx, name=rt.name)
    await windows.prepare(ctx=ctx, rt=rt, epoch=1, state="open")
    await windows.initialise_pointers(ctx=ctx, rt=rt)
    await windows.prepare(ctx=ctx, rt=rt, epoch=2, state="prepared")
    return to_out(stream, tables)


def to_out(stream: Stream, tables: list[CountTable] | tuple) -> StreamOut:
    rt = _runtime(stream, list(tables))
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
    cache: dict[str, tuple[float, StreamRuntime]] = ctx.caches.setdefault("runtime", {})
    hit = cache.get(name)
    now = time.monotonic()
    if hit is not None and now - hit[0] < RUNTIME_TTL_SECONDS:
        return hit[1]
    async with ctx.sessionmaker() as session:
        stream = await get(session=session, name=name)
        rt = _runtime(stream, list(await repository.tables_of(session, stream.id)))
    cache[name] = (now, rt)
    return rt


def forget_runtime(ctx: AppContext, name: str) -> None:
    ctx.caches.get("runtime", {}).pop(name, None)
