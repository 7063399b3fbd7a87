"""The roll: a stream moves one window forward (docs/ARCHITECTURE.md, "Life cycle"), and
expiry (``service.lifecycle.expire``).

Crash safety. A roll to epoch T is a sequence of idempotent steps. Its start is checkpointed
in SQL (``stream.roll_target = T``) before anything else changes; every later step checks
whether it is already done (window states in Redis, the ``served`` pointer, SQL rows), so a
second run after a crash at any line completes the first run's work without double effects,
and a roll request that finds an unfinished roll completes that one first. The commit writes
the retrain events and the roll's follow-ups (``followups``) in the same transaction; the
follow-ups run as keyed jobs of the worker, never in the process that rolled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from prometheus_client import Histogram

from service.context import AppContext
from service.core.features.runtime import StreamRuntime
from service.counting import service as counting
from service.errors import NotFound
from service.features import pointer
from service.lifecycle import followups
from service.lifecycle.expire import expire
from service.models import service as models
from service.streams import repository
from service.streams import service as streams
from service.streams.lock import stream_lock
from service.windows import service as windows
from service.windows.schedule import roll_due

Step = Callable[[str], None]
log = logging.getLogger("selectivity.lifecycle")

ROLL_SECONDS = Histogram(
    "selectivity_roll_seconds",
    "time a roll took, from taking the stream's lock to expiry (rolls that happened)",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)


async def roll(
    *,
    ctx: AppContext,
    name: str,
    only_if_due: bool = False,
    now: datetime | None = None,
    step: Step | None = None,
) -> int:
    """Roll stream ``name`` one window forward (or finish an interrupted roll). Returns the
    open epoch afterwards. ``only_if_due``: the scheduler's call, rolls only when the window is
    ``window_seconds`` old. ``step`` is called after each durable step (tests inject crashes)."""
    mark = step or (lambda _name: None)
    store = ctx.stores.windows
    async with stream_lock(ctx, name):
        now = now or datetime.now(UTC)
        async with ctx.sessionmaker() as session, session.begin():
            stream = await repository.get_by_name(session, name, for_update=True)
            if stream is None:
                raise NotFound(f"stream {name!r} not found")
            if stream.roll_target is None:
                started = stream.epoch_started_at
                cfg_seconds = int(stream.config.get("window_seconds", 86400))
                if only_if_due and not roll_due(
                    epoch_started_at=started, window_seconds=cfg_seconds, now=now
                ):
                    return stream.epoch
                stream.roll_target = stream.epoch + 1
            target = stream.roll_target
        mark("checkpoint")
        began = time.perf_counter()
        streams.forget_runtime(ctx, name)
        rt = await streams.runtime(ctx=ctx, name=name)
        previous = target - 1

        await windows.prepare(ctx=ctx, rt=rt, epoch=target, state="open")
        mark("opened")
        # Before window T takes any count, the window leaving the count period (T − H − R)
        # must be gone from the tables and from every aggregate: Redis never holds more than
        # R + H windows, nor what another window could be recovered from.
        if rt.config.hot_windows >= 2 and not await windows.aggregate_ready(
            ctx=ctx, rt=rt, epoch=target
        ):  # the previous roll's follow-up did not build it: the entering window closed a
            # roll ago, so count it to its end and build the aggregate now, as it would have
            entering = rt.count_period(target)[1]
            if entering >= 1:
                await counting.count_window(ctx=ctx, rt=rt, window=entering)
            await windows.build_aggregate(ctx=ctx, rt=rt, epoch=target)
        ahead = await windows.aggregate_ready(ctx=ctx, rt=rt, epoch=target)
        if ahead:
            # featurize moves to the new epoch first, then ingest (the old aggregate can go)
            await store.set_served(name, target)
            pointer.moved(ctx, name, target)
            mark("served")
        else:  # one hot window: serve the old epoch without the leaving window meanwhile
            await windows.trim_aggregate(ctx=ctx, rt=rt, epoch=target)
            mark("trimmed")
        await windows.drop_leaving(ctx=ctx, rt=rt, epoch=target)
        mark("dropped")
        await store.set_epoch(name, target)
        mark("pointed")
        await store.set_state(name, previous, "closed", parts=rt.parts)
        mark("closed")
        await count_closed(ctx=ctx, rt=rt, epoch=target, entering_only=ahead)
        mark("counted")
        await windows.update_aggregate(ctx=ctx, rt=rt, epoch=target)
        pointer.moved(ctx, name, target)
        mark("aggregated")

        hot_lo, _ = rt.hot_period(target)
        count_lo, count_hi = rt.count_period(target)
        async with ctx.sessionmaker() as session, session.begin():
            stream = await repository.get_by_name(session, name, for_update=True)
            assert stream is not None
            if stream.roll_target == target:
                prev_w = await repository.ensure_window(session, stream.id, previous, "hot", now)
                if prev_w.closed_at is None:
                    prev_w.closed_at = now
                    prev_w.state = "hot" if previous >= hot_lo else "counted"
                if count_hi >= 1:
                    w = await repository.get_window(session, stream.id, count_hi)
                    if w is not None and w.counted_at is None:
                        w.state, w.counted_at = "counted", now
                await repository.ensure_window(session, stream.id, target, "open", now)
                stream.epoch = target
                stream.epoch_started_at = now
                stream.roll_target = None
                # in the same transaction: a crash can lose neither the retrain events nor
                # the work the roll leaves to the worker
                await models.record_roll(session=session, stream=stream, epoch=target, now=now)
                await followups.record(session, stream_id=stream.id, epoch=target)
        mark("committed")
        ctx.caches.model_status.clear()  # other processes see it within a second
        await followups.enqueue(ctx, name=name, stream_id=rt.id, epoch=target)
        mark("enqueued")
        await expire(ctx=ctx, rt=rt, epoch=target, now=now)
        mark("expired")
        ROLL_SECONDS.observe(time.perf_counter() - began)
        return target


async def count_closed(
    *, ctx: AppContext, rt: StreamRuntime, epoch: int, entering_only: bool = False
) -> None:
    """Count every closed window of the hot period of ``epoch`` and the window that just left
    it to its end (they take no more entries): a window's tables are complete before they
    join the count period, and its hot data is counted before it can be deleted.
    ``entering_only`` (the aggregate of ``epoch`` was built ahead): only the window that just
    left the hot period (a no-op unless the follow-up that counts it did not run); the
    windows still hot, among them the one the roll closed, are counted by the roll's
    follow-up (``followups.build_next``) or at the latest by the roll they leave the hot period
    at, so the roll does not wait for the tail of the window it closes."""
    lo, hi = rt.hot_period(epoch)
    for w in range(max(lo - 1, 1), lo if entering_only else hi):
        await counting.count_window(ctx=ctx, rt=rt, window=w)
