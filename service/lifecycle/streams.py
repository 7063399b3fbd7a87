"""Creating a stream: its SQL rows, then its first two windows' noise-initialised tables and
its epoch pointers in Redis."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core.budget import budget_split, noise_for
from service.core.featurize import table_name
from service.core.streamconfig import StreamCreate
from service.db.models import CountTable, Stream
from service.errors import Conflict, ValidationError
from service.features import pointer
from service.streams import repository
from service.streams import service as streams
from service.streams.schemas import StreamOut
from service.windows import service as windows

# Cells are int32: noise beyond ~1e7 would saturate them and carries no useful signal anyway.
MAX_NOISE_SCALE = 1e7


async def create(*, ctx: AppContext, session: AsyncSession, stream_in: StreamCreate) -> StreamOut:
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
    rt = streams.runtime_of(stream, tables)
    await windows.forget_leftovers(ctx=ctx, name=rt.name)
    await windows.prepare(ctx=ctx, rt=rt, epoch=1, state="open")
    await windows.initialise_pointers(ctx=ctx, rt=rt)
    pointer.moved(ctx, rt.name, 1)
    await windows.prepare(ctx=ctx, rt=rt, epoch=2, state="prepared")
    return streams.to_out(stream, tables)
