"""Creating a stream: its SQL rows, then its first two windows' noise-initialised tables and
its epoch pointers in Redis.

No SQL transaction is open while Redis is written (with a large sketch that takes tens of
seconds, and on SQLite a transaction that has written holds the database's only write lock).
Under the stream's lock, a short transaction records the stream as ``creating`` (with its
tables and window 1); Redis is prepared outside any transaction; a second short transaction
marks it ``ready``. Until then every lookup but this module's misses it (404: no ingest, no
featurize, no roll). A creation that fails cleans up after itself; one whose process died is
cleaned by the next creation of the same name or by the scheduler tick (``clean_abandoned``),
which find its lock free (docs/ARCHITECTURE.md, "Life cycle")."""

from __future__ import annotations

import asyncio
import logging
import secrets
from datetime import UTC, datetime

from sqlalchemy.exc import IntegrityError

from service.context import AppContext
from service.core.dp.budget import budget_split, noise_for, unused_slots
from service.core.features.columns import table_name
from service.core.streamconfig import StreamCreate
from service.db.models import CountTable, Stream
from service.errors import Conflict, ValidationError
from service.features import pointer
from service.streams import repository
from service.streams import service as streams
from service.streams.lock import stream_lock
from service.streams.schemas import StreamOut
from service.windows import service as windows

log = logging.getLogger("selectivity.lifecycle")

# Cells are int32: noise beyond ~1e7 would saturate them and carries no useful signal anyway.
MAX_NOISE_SCALE = 1e7


def _check(ctx: AppContext, stream_in: StreamCreate) -> None:
    if ctx.settings.env == "production" and stream_in.privacy.mechanism == "none":
        raise ValidationError("privacy.mechanism 'none' is refused in production")
    wasted = unused_slots(stream_in)  # at creation only: a stored configuration keeps its own
    if wasted:
        raise ValidationError(wasted)
    noise = noise_for(stream_in)
    largest = max(budget_split(stream_in), key=lambda row: row["noise_scale"])
    if largest["noise_scale"] > MAX_NOISE_SCALE:
        raise ValidationError(
            f"privacy: noise scale {largest['noise_scale']:.3g} of table {largest['table']!r} "
            f"(sensitivity {noise.l1_sensitivity:g} / budget, weighted) exceeds the limit of "
            f"{MAX_NOISE_SCALE:.0e}; raise epsilon/rho or its weight, or lower max_tables or "
            f"sketch.depth"
        )


def _exists(name: str) -> Conflict:
    return Conflict(f"stream {name!r} already exists")


async def create(*, ctx: AppContext, stream_in: StreamCreate) -> StreamOut:
    """Create stream ``stream_in.name`` (409 if it exists or another request is creating it)
    and prepare its first windows; returns it once it is ready."""
    _check(ctx, stream_in)
    name = stream_in.name
    async with ctx.sessionmaker() as session:
        if await repository.get_by_name(session, name) is not None:
            raise _exists(name)
    busy = Conflict(f"stream {name!r} is being created by another request; retry later")
    async with stream_lock(ctx, name, wait=0, busy=busy):
        # whoever held the lock is done: a stream of this name still creating was abandoned
        async with ctx.sessionmaker() as session:
            left = await repository.get_by_name(session, name, creating=True)
            if left is not None and left.state == repository.READY:
                raise _exists(name)
        if left is not None:
            await _discard(ctx, left)
        now = datetime.now(UTC)
        stream = Stream(
            name=name,
            state=repository.CREATING,
            config=stream_in.model_dump(mode="json"),
            hash_seed=secrets.token_bytes(32),
            epoch=1,
            epoch_started_at=now,
        )
        tables = [
            CountTable(
                name=table_name([f.name]), features=[f.name], first_epoch=1, reason="feature"
            )
            for f in stream_in.features
        ]
        try:
            async with ctx.sessionmaker() as session, session.begin():
                await repository.create(session, stream, tables)
                await repository.ensure_window(session, stream.id, 1, "open", now)
        except IntegrityError:  # created meanwhile by a holder of an expired lock
            raise _exists(name) from None
        try:
            await _prepare(ctx, stream, tables)
            async with ctx.sessionmaker() as session, session.begin():
                ready_at = datetime.now(UTC)  # window 1 starts now, not before its tables
                await repository.mark_ready(session, stream.id, ready_at)
        except BaseException:
            await asyncio.shield(_discard(ctx, stream))
            raise
    stream.state, stream.epoch_started_at = repository.READY, ready_at
    return streams.to_out(stream, tables)


async def _prepare(ctx: AppContext, stream: Stream, tables: list[CountTable]) -> None:
    """Redis: window 1 open, the pointers (epoch = served = 1, an empty aggregate), window 2
    prepared. Clears first what an earlier creation of the name may have left."""
    rt = streams.runtime_of(stream, tables)
    await windows.forget_leftovers(ctx=ctx, name=rt.name, parts=rt.parts)
    await windows.prepare(ctx=ctx, rt=rt, epoch=1, state="open")
    await windows.initialise_pointers(ctx=ctx, rt=rt)
    pointer.moved(ctx, rt.name, 1)
    await windows.prepare(ctx=ctx, rt=rt, epoch=2, state="prepared")


async def _discard(ctx: AppContext, stream: Stream) -> None:
    """Delete a stream that never became ready: its Redis keys (tables, window states,
    pointers, aggregate), then its rows. The caller holds the stream's lock."""
    async with ctx.sessionmaker() as session:
        ids = [t.id for t in await repository.tables_of(session, stream.id)]
    store = ctx.stores.windows
    parts = int(stream.config.get("partitions", 1))
    for epoch in (1, 2):
        if ids:
            await store.delete_tables(stream.name, epoch, ids, parts=parts)
        await store.delete_meta(stream.name, epoch, parts=parts)
    await store.delete_aggs_before(stream.name, 2, oldest=1)
    await store.clear_pointers(stream.name)
    pointer.moved(ctx, stream.name, None)
    async with ctx.sessionmaker() as session, session.begin():
        await repository.delete_creating(session, stream.id)


async def clean_abandoned(ctx: AppContext) -> int:
    """The scheduler tick's part: delete every stream still ``creating`` whose lock is free
    (its creation died with its process). Returns how many."""
    async with ctx.sessionmaker() as session:
        names = [s.name for s in await repository.list_creating(session)]
    cleaned = 0
    for name in names:
        busy = Conflict(f"stream {name!r} is being created")
        try:
            async with stream_lock(ctx, name, wait=0, busy=busy):
                async with ctx.sessionmaker() as session:
                    left = await repository.get_by_name(session, name, creating=True)
                if left is None or left.state != repository.CREATING:
                    continue
                await _discard(ctx, left)
                cleaned += 1
                log.warning("removed stream %s, whose creation did not finish", name)
        except Conflict:  # its creation is under way
            continue
    return cleaned
