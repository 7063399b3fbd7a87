"""Expiry: delete what left its period (docs/ARCHITECTURE.md, "Life cycle"). Run by every
roll, by the seal job once it sealed a window, and by a selection round's follow-up."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from service.anonymize import service as anonymize
from service.audits import service as audits
from service.context import AppContext
from service.core.features.runtime import StreamRuntime
from service.counting import service as counting
from service.db.models import ColdSegment, FollowUp, Window
from service.db.session import scrub_deleted
from service.reference import service as reference
from service.streams import repository

log = logging.getLogger("selectivity.lifecycle")

FOLLOW_UP_MAX_ATTEMPTS = 5  # a follow-up that failed this often is left for an operator


async def _windows_rounds_will_read(
    session: AsyncSession, rt: StreamRuntime, hot_lo: int
) -> set[int]:
    """Windows before the hot period that a selection round not yet run will read: the round
    of the roll to E reads windows E − H … E − 1 (``service.selection``)."""
    pending = await session.execute(
        select(FollowUp.epoch).where(
            FollowUp.stream_id == rt.id,
            FollowUp.kind == "selection_round",
            FollowUp.done_at.is_(None),
            FollowUp.attempts < FOLLOW_UP_MAX_ATTEMPTS,
        )
    )
    h = rt.config.hot_windows
    return {w for e in pending.scalars() for w in range(e - h, e) if w < hot_lo}


async def _drop_segment_statistics(session: AsyncSession, w: Window) -> None:
    """The window's cold segments keep no exact statistic past the hot period: their row
    counts and first/last entry ids (exact arrival times) go, their times become the window's
    open/close times; so does the window's seal cursor (its last entry id)."""
    await session.execute(
        update(ColdSegment)
        .where(ColdSegment.stream_id == w.stream_id, ColdSegment.epoch == w.epoch)
        .values(
            count=None,
            first_id=None,
            last_id=None,
            first_ts=w.opened_at,
            last_ts=w.closed_at or w.opened_at,
        )
    )
    w.seal_cursor = None


async def expire(
    *, ctx: AppContext, rt: StreamRuntime, epoch: int, now: datetime | None = None
) -> dict[str, int]:
    """Delete what left its period: hot data of sealed windows before the hot period, the
    reference models (and their exact statistics) of earlier epochs, the tables of windows
    past retention, every aggregate older than the served epoch. Hot data of windows not yet
    sealed into the cold store is kept (the seal checkpoint is
    ``stream_window.cold_sealed_at``), so is hot data a pending selection round of the roll
    that closed it has still to read (the round's follow-up expires it when done), and hot
    data is counted before it is deleted; a
    reference model is deleted at once (docs/PRIVACY.md,
    promise 1). No exact per-window statistic is stored in SQL (``GET /windows`` counts the
    hot windows' observations live; a cold segment's row count and entry range are dropped
    with the window's hot data)."""
    store = ctx.stores.windows
    now = now or datetime.now(UTC)
    hot_lo, _ = rt.hot_period(epoch)
    count_lo, _ = rt.count_period(epoch)
    ids = [t.id for t in rt.tables]
    deleted_hot = deleted_tables = 0
    async with ctx.sessionmaker() as session, session.begin():  # first, on its own
        deleted_models = await reference.expire(
            ctx=ctx, session=session, stream_id=rt.id, epoch=epoch
        )
    # No SQL transaction is open while Redis is counted or deleted (on SQLite a transaction
    # that has written holds the only write lock): read first, then one short transaction
    # after each window's Redis work (a crash in between: the next expire redoes it, a no-op).
    async with ctx.sessionmaker() as session:
        read_by_rounds = await _windows_rounds_will_read(session, rt, hot_lo)
        hot = [
            w
            for w in await repository.windows_to_expire_hot(session, rt.id, hot_lo)
            if w.epoch not in read_by_rounds
        ]
        past = list(await repository.windows_past_retention(session, rt.id, count_lo))
        # windows whose raw rows went before folding existed: folded now (a no-op after)
        unfolded = (
            list(await repository.windows_hot_deleted(session, rt.id)) if rt.parts > 1 else []
        )
    for w in hot:
        await counting.count_window(ctx=ctx, rt=rt, window=w.epoch)  # a no-op once counted
        # the exact counts of parts p ≥ 1 carry no noise: folded into part 0 (noise and all
        # the counts) before the window's raw rows go, so none outlives them (PRIVACY.md)
        await store.fold(rt.name, w.epoch, ids, parts=rt.parts)
        await store.delete_hot(rt.name, w.epoch, parts=rt.parts)
        await ctx.stores.ingest.forget_unpointed(rt.name, [w.epoch])  # if one failed
        async with ctx.sessionmaker() as session, session.begin():
            row = await session.get(Window, w.id)
            if row is not None:
                row.hot_deleted_at = now
                await _drop_segment_statistics(session, row)
        deleted_hot += 1
    folded_late = 0
    for w in unfolded:
        if w.epoch >= count_lo and not await store.folded(rt.name, w.epoch):
            folded_late += await store.fold(rt.name, w.epoch, ids, parts=rt.parts)
    for w in past:
        await store.delete_tables(rt.name, w.epoch, ids, parts=rt.parts)
    if past:
        async with ctx.sessionmaker() as session, session.begin():
            await session.execute(
                update(Window)
                .where(Window.id.in_([w.id for w in past]))
                .values(state="expired", expired_at=now)
            )
        deleted_tables = len(past)
    # every aggregate older than the served one: the previous epoch's holds the window whose
    # tables went at this roll (docs/ARCHITECTURE.md, "Life cycle")
    served = min(epoch, await store.served(rt.name) or epoch)
    await store.delete_aggs_before(rt.name, served, oldest=served - 64)
    # an Idempotency-Key is honoured for its TTL, whatever the rolls: its window's records
    # (keyed tokens, keyed fingerprints, responses; no row) expire by themselves; those made
    # before they did go with the hot period, as they did then
    await ctx.stores.ingest.forget_unpointed(rt.name, range(max(1, hot_lo - 1), hot_lo))
    # k-anonymised releases and iML sessions of hot rows go with their oldest window's period
    deleted_releases = await anonymize.expire(ctx=ctx, rt=rt, epoch=epoch)
    # so do re-identification audits of hot records (their figures are about them)
    deleted_audits = await audits.expire_for_stream(ctx=ctx, rt=rt, epoch=epoch)
    if deleted_hot or folded_late or deleted_releases or deleted_audits:
        await store.rewrite_aof()  # (the AOF holds every write of what was deleted)
    if not await scrub_deleted(ctx.engine) and ctx.engine.dialect.name == "sqlite":
        log.warning("the SQLite WAL was busy: deleted rows are scrubbed at the next expiry")
    return {
        "hot_windows_deleted": deleted_hot,
        "table_windows_deleted": deleted_tables,
        "reference_models_deleted": deleted_models,
        "anonymizations_deleted": deleted_releases,
        "reidentification_audits_deleted": deleted_audits,
    }
