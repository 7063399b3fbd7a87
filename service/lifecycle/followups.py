"""What a roll leaves to the worker, durably (a transactional outbox).

The roll's commit writes one ``follow_up`` row per kind for (stream, epoch) in the same
transaction as the new epoch; after the commit the roll enqueues one keyed job per row
(``<kind>:<stream>:<epoch>``), and the scheduler tick re-enqueues every row not done yet, so
a crash at any line loses none of them. Each kind is idempotent per (stream, epoch): a second
run completes the first's work without doing any of it twice. They run in the worker, never
in the process that rolled.

- ``windows_prepare_next``: noise-initialise the tables of window epoch + 1 ahead of the next
  roll (a no-op once it is prepared or open), and, with ``hot_windows`` ≥ 2, count the
  window that enters the count period at the next roll to its end (the roll left the tail of
  the window it closed here) and build the count-period aggregate the next roll will serve
  (``build_next``), so that the roll moves ``served`` at once.
- ``selection_round``: DP count-table selection on the hot period that just closed
  (``service.selection``; its commit holds the stream lock and re-checks the free slots).
- ``reference_refresh``: train and score this epoch's reference model (the previous one was
  deleted by the roll's ``expire``).
- ``models_notify``: deliver the roll's retrain events to model webhooks.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core.features.runtime import StreamRuntime
from service.counting import service as counting
from service.db.models import FollowUp, Stream
from service.lifecycle.expire import FOLLOW_UP_MAX_ATTEMPTS, expire
from service.models import service as models
from service.reference import service as reference
from service.selection import service as selection
from service.streams import service as streams
from service.streams.lock import stream_lock
from service.windows import service as windows

log = logging.getLogger("selectivity.lifecycle")

KINDS = ("windows_prepare_next", "selection_round", "reference_refresh", "models_notify")
MAX_ATTEMPTS = FOLLOW_UP_MAX_ATTEMPTS  # then it is left for an operator (logged)
TIMEOUT_SECONDS = 600


def job_key(kind: str, name: str, epoch: int) -> str:
    return f"{kind}:{name}:{epoch}"


async def record(session: AsyncSession, *, stream_id: int, epoch: int) -> None:
    """In the roll's transaction: the follow-ups of the roll to ``epoch``."""
    have = set(
        (
            await session.execute(
                select(FollowUp.kind).where(
                    FollowUp.stream_id == stream_id, FollowUp.epoch == epoch
                )
            )
        )
        .scalars()
        .all()
    )
    for kind in KINDS:
        if kind not in have:
            session.add(FollowUp(stream_id=stream_id, epoch=epoch, kind=kind))
    await session.flush()


async def enqueue(ctx: AppContext, *, name: str, stream_id: int, epoch: int) -> int:
    """Enqueue the follow-ups of (stream, epoch) not done yet; returns how many were new."""
    async with ctx.sessionmaker() as session:
        rows = (
            await session.execute(
                select(FollowUp.kind).where(
                    FollowUp.stream_id == stream_id,
                    FollowUp.epoch == epoch,
                    FollowUp.done_at.is_(None),
                )
            )
        ).scalars()
        kinds = list(rows.all())
    new = 0
    for kind in kinds:
        new += await ctx.jobs.enqueue(
            kind,
            key=job_key(kind, name, epoch),
            timeout=TIMEOUT_SECONDS,
            stream=name,
            epoch=epoch,
        )
    return new


async def pending(ctx: AppContext) -> list[tuple[str, str, int]]:
    """Every follow-up not done yet that may still be tried: (kind, stream, epoch)."""
    async with ctx.sessionmaker() as session:
        rows = await session.execute(
            select(FollowUp.kind, Stream.name, FollowUp.epoch)
            .join(Stream, Stream.id == FollowUp.stream_id)
            .where(FollowUp.done_at.is_(None), FollowUp.attempts < MAX_ATTEMPTS)
            .order_by(FollowUp.id)
        )
        return [(k, n, e) for k, n, e in rows.all()]


async def enqueue_pending(ctx: AppContext) -> int:
    """The scheduler tick's sweep: enqueue every unfinished follow-up (a no-op for those
    queued or running already). Returns how many were enqueued anew."""
    new = 0
    for kind, name, epoch in await pending(ctx):
        new += await ctx.jobs.enqueue(
            kind, key=job_key(kind, name, epoch), timeout=TIMEOUT_SECONDS, stream=name, epoch=epoch
        )
    return new


async def build_next(*, ctx: AppContext, rt: StreamRuntime, epoch: int) -> bool:
    """The roll's follow-up ahead of the roll to ``epoch`` + 1 (``hot_windows`` ≥ 2): count the
    window that enters the count period then to its end (the roll to ``epoch`` left the tail
    of the window it closed here), then build the aggregate that roll will serve
    (``windows.build_next``). A second run finds both done."""
    if rt.config.hot_windows < 2 or await ctx.stores.windows.epoch(rt.name) != epoch:
        return False
    entering = rt.count_period(epoch + 1)[1]
    if entering >= 1:
        await counting.count_window(ctx=ctx, rt=rt, window=entering)
    return await windows.build_next(ctx=ctx, rt=rt, epoch=epoch)


async def _work(ctx: AppContext, kind: str, name: str, stream_id: int, epoch: int) -> Any:
    if kind == "windows_prepare_next":
        if await ctx.stores.windows.epoch(name) != epoch:
            return {"prepared": False, "reason": "the stream moved on"}
        rt = await streams.runtime(ctx=ctx, name=name)
        prepared = await windows.prepare(ctx=ctx, rt=rt, epoch=epoch + 1)
        built = await build_next(ctx=ctx, rt=rt, epoch=epoch)
        return {"prepared": prepared, "aggregate_built": built}
    if kind == "selection_round":
        return await selection.select_tables(
            ctx=ctx, name=name, epoch=epoch, max_attempts=MAX_ATTEMPTS
        )
    if kind == "reference_refresh":
        trained = await reference.train(ctx=ctx, name=name, epoch=epoch)
        return {"trained": trained is not None}
    if kind == "models_notify":
        return await models.notify_roll(ctx=ctx, stream_id=stream_id, epoch=epoch)
    raise ValueError(f"unknown follow-up {kind!r}")


async def run(ctx: AppContext, *, kind: str, name: str, epoch: int) -> dict[str, Any]:
    """Run one follow-up (the job body): once done, a rerun returns its recorded result."""
    async with ctx.sessionmaker() as session, session.begin():
        row = (
            await session.execute(
                select(FollowUp)
                .join(Stream, Stream.id == FollowUp.stream_id)
                .where(Stream.name == name, FollowUp.epoch == epoch, FollowUp.kind == kind)
            )
        ).scalar_one_or_none()
        if row is None:
            return {"skipped": "no such follow-up"}
        if row.done_at is not None:
            return dict(row.result or {})
        row.attempts += 1
        row_id, stream_id = row.id, row.stream_id
    try:
        result = await _work(ctx, kind, name, stream_id, epoch)
    except Exception as exc:
        log.error(
            "follow-up %s of %s at epoch %d failed: %s", kind, name, epoch, type(exc).__name__
        )
        raise
    async with ctx.sessionmaker() as session, session.begin():
        fresh = await session.get(FollowUp, row_id)
        if fresh is not None and fresh.done_at is None:
            # a selection round's duration grows with the hot period's size: its record keeps
            # the roll's time (public), never when it finished
            fresh.done_at = fresh.created_at if kind == "selection_round" else datetime.now(UTC)
            fresh.result = dict(result)
    if kind == "selection_round":  # the windows it kept from expiry may go now
        rt = await streams.runtime(ctx=ctx, name=name)
        async with stream_lock(ctx, name):
            current = await ctx.stores.windows.epoch(name)
            if current is not None:
                await expire(ctx=ctx, rt=rt, epoch=current)
    return dict(result)


async def run_pending(ctx: AppContext) -> int:
    """Run every unfinished follow-up here and now, in order (tests, and ``selectivity``
    commands run without a worker). Returns how many ran."""
    ran = 0
    for kind, name, epoch in await pending(ctx):
        await run(ctx, kind=kind, name=name, epoch=epoch)
        ran += 1
    return ran
