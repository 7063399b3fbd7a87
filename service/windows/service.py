"""Window life cycle: prepare_next_window, roll, expire (DESIGN §3, §8).

Crash safety. A roll to epoch T is a sequence of idempotent steps. Its start is checkpointed
in SQL (``stream.roll_target = T``) before anything else changes; every later step checks
whether it is already done (window states in Redis, the ``served`` pointer, SQL rows), so a
second run after a crash at any line completes the first run's work without double effects,
and a roll request that finds an unfinished roll completes that one first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import numpy as np
from redis.exceptions import LockError
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core.noise import sample_noise
from service.errors import NotFound, Unavailable
from service.models import service as models
from service.streams import repository
from service.streams import service as streams
from service.streams.runtime import StreamRuntime
from service.windows.schedule import roll_due
from service.windows.schemas import WindowOut, WindowsOut
from service.windows.store import Aggregate, WindowStore

log = logging.getLogger("selectivity.windows")
INT32_MAX = 2**31 - 1
ROLL_LOCK_WAIT_SECONDS = 600.0  # a caller waits this long for a running roll to finish


@contextlib.asynccontextmanager
async def stream_lock(ctx: AppContext, name: str) -> AsyncIterator[None]:
    """The per-stream roll lock (rolls, and expire outside a roll), renewed while held: it
    expires ``roll_lock_seconds`` after its holder dies, so a killed roll blocks the next one
    for at most that long, however long a live roll takes."""
    ttl = ctx.settings.roll_lock_seconds
    lock = store_of(ctx).lock(name, "roll", timeout=ttl, blocking_timeout=ROLL_LOCK_WAIT_SECONDS)
    if not await lock.acquire():
        raise Unavailable(f"stream {name!r} is being rolled by another process; retry later")

    async def renew() -> None:
        while True:
            await asyncio.sleep(ttl / 3)
            await lock.reacquire()

    keeper = asyncio.create_task(renew())
    try:
        yield
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await keeper
        with contextlib.suppress(LockError):  # expired while we were stalled: nothing to free
            await lock.release()


def noise_tables(
    mechanism: str,
    scales: list[float],
    prior_scale: float,
    table_ids: list[int],
    cells: int,
    n_labels: int,
) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """Fresh noise for every cell of a window's tables (table ``table_ids[i]`` at
    ``scales[i]``) and its prior table (at ``prior_scale``), from the CSPRNG
    (``service.core.noise``). Runs in the process pool."""

    def draw(scale: float, size: int) -> np.ndarray:
        if mechanism == "none":
            return np.zeros(size, dtype=np.int64)
        noise = sample_noise(mechanism=mechanism, scale=scale, size=size)  # type: ignore[arg-type]
        return np.clip(noise, -INT32_MAX, INT32_MAX, out=noise)

    tables = {tid: draw(scale, cells) for tid, scale in zip(table_ids, scales, strict=True)}
    return tables, draw(prior_scale, n_labels)


def store_of(ctx: AppContext) -> WindowStore:
    st = ctx.caches.get("window_store")
    if st is None:
        st = ctx.caches["window_store"] = WindowStore(ctx.redis, ctx.keys)
    return st


async def prepare(
    *, ctx: AppContext, rt: StreamRuntime, epoch: int, state: str = "prepared"
) -> bool:
    """Noise-initialise window ``epoch``'s tables (prepare_next_window). A no-op when the window
    is already prepared, open or closed; ``state='open'`` opens a prepared window."""
    store = store_of(ctx)
    current = await store.state(rt.name, epoch)
    if current in ("open", "closed"):
        return False
    if current == "prepared":
        if state == "open":
            await store.set_state(rt.name, epoch, "open")
        return False
    live = [t for t in rt.tables if t.first_epoch <= epoch]
    tables, prior = await ctx.run_cpu(
        noise_tables,
        rt.noise.mechanism,
        [rt.noise.scale_for(rt.weight_of(t)) for t in live],
        rt.noise.scale_for(rt.prior_weight),
        [t.id for t in live],
        rt.spec.cells,
        rt.spec.n_labels,
    )
    return await store.write_tables(rt, epoch, tables, prior, state=state)


async def forget_leftovers(*, ctx: AppContext, name: str) -> None:
    """Before a new stream's first windows are prepared: drop window state and pointers that a
    creation of the same name left behind when its SQL transaction failed after writing to
    Redis (the name is new in SQL, so nothing under it in Redis is live)."""
    store = store_of(ctx)
    await store.delete_meta(name, 1)
    await store.delete_meta(name, 2)
    await store.clear_pointers(name)


async def initialise_pointers(*, ctx: AppContext, rt: StreamRuntime) -> None:
    store = store_of(ctx)
    lo, hi = rt.count_period(1)
    await store.write_agg(
        rt.name, Aggregate(1, lo, hi, [], [], np.zeros(rt.spec.n_labels, np.int64))
    )
    await store.set_epoch(rt.name, 1)
    await store.set_served(rt.name, 1)


async def update_aggregate(*, ctx: AppContext, rt: StreamRuntime, epoch: int) -> Aggregate:
    """The count-period aggregate of ``epoch``: incrementally, ``agg(e) = agg(e−1) + entering
    − leaving`` (sketches are linear), or summed afresh when agg(e−1) is missing. One flat
    array, one MGET per window: O(tables), not O(data)."""
    store = store_of(ctx)
    served = await store.served(rt.name)
    if served is not None and served >= epoch:
        done = await store.read_agg(rt.name, epoch)
        if done is not None:
            return done
    lo, hi = rt.count_period(epoch)
    ids = [t.id for t in rt.tables]
    layout = [(tid, rt.spec.cells) for tid in ids]
    prev = await store.read_agg(rt.name, epoch - 1)
    if prev is None or (prev.lo, prev.hi) != (lo - 1, hi - 1):
        return await _sum_afresh(ctx, rt, epoch, lo, hi, ids)
    cells = prev.aligned(layout, rt.spec.n_labels)
    windows = [w for w in prev.windows if w >= lo]
    for w in (w for w in prev.windows if w < lo):
        leaving = await store.read_window(rt, w, ids)
        if leaving is None:  # deleted already: cannot subtract, so sum afresh
            return await _sum_afresh(ctx, rt, epoch, lo, hi, ids)
        cells -= leaving
    if hi >= 1 and hi not in windows:
        entering = await store.read_window(rt, hi, ids)
        if entering is not None:
            cells += entering
            windows.append(hi)
    agg = Aggregate(epoch, lo, hi, sorted(windows), layout, cells)
    await store.write_agg(rt.name, agg)
    await store.set_served(rt.name, epoch)
    return agg


async def _sum_afresh(
    ctx: AppContext, rt: StreamRuntime, epoch: int, lo: int, hi: int, ids: list[int]
) -> Aggregate:
    store = store_of(ctx)
    layout = [(tid, rt.spec.cells) for tid in ids]
    cells = np.zeros(rt.spec.cells * len(ids) + rt.spec.n_labels, np.int64)
    windows: list[int] = []
    for w in range(max(lo, 1), hi + 1):
        flat = await store.read_window(rt, w, ids)
        if flat is None:
            continue
        cells += flat
        windows.append(w)
    agg = Aggregate(epoch, lo, hi, windows, layout, cells)
    await store.write_agg(rt.name, agg)
    await store.set_served(rt.name, epoch)
    return agg


Step = Callable[[str], None]


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
    store = store_of(ctx)
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
        streams.forget_runtime(ctx, name)
        rt = await streams.runtime(ctx=ctx, name=name)
        previous = target - 1

        await prepare(ctx=ctx, rt=rt, epoch=target, state="open")
        mark("opened")
        await store.set_epoch(name, target)
        mark("pointed")
        await store.set_state(name, previous, "closed")
        mark("closed")
        await count_closed(ctx=ctx, rt=rt, epoch=target)
        mark("counted")
        await update_aggregate(ctx=ctx, rt=rt, epoch=target)
        mark("aggregated")

        observations = await store.hot_length(name, previous)
        hot_lo, _ = rt.hot_period(target)
        count_lo, count_hi = rt.count_period(target)
        async with ctx.sessionmaker() as session, session.begin():
            stream = await repository.get_by_name(session, name, for_update=True)
            assert stream is not None
            if stream.roll_target == target:
                prev_w = await repository.ensure_window(session, stream.id, previous, "hot", now)
                if prev_w.closed_at is None:
                    prev_w.closed_at = now
                    prev_w.observations = observations
                    prev_w.state = "hot" if previous >= hot_lo else "counted"
                if count_hi >= 1:
                    w = await repository.get_window(session, stream.id, count_hi)
                    if w is not None and w.counted_at is None:
                        w.state, w.counted_at = "counted", now
                await repository.ensure_window(session, stream.id, target, "open", now)
                stream.epoch = target
                stream.epoch_started_at = now
                stream.roll_target = None
                # in the same transaction: a crash cannot lose the retrain events
                events = await models.record_roll(
                    session=session, stream=stream, epoch=target, now=now
                )
            else:
                events = []
        mark("committed")
        ctx.caches.pop("model_status", None)  # other processes see it within a second
        models.dispatch(ctx, events)
        ctx.spawn(after_roll(ctx=ctx, name=name, epoch=target))
        await expire(ctx=ctx, rt=rt, epoch=target, now=now)
        mark("expired")
        return target


async def count_closed(*, ctx: AppContext, rt: StreamRuntime, epoch: int) -> None:
    """Count every closed window of the hot period of ``epoch`` and the window that just left
    it to its end (they take no more entries): a window's tables are complete before they
    join the count period, and its hot data is counted before it can be deleted."""
    from service.ingest import service as ingest  # (ingest imports this module)

    lo, hi = rt.hot_period(epoch)
    for w in range(max(lo - 1, 1), hi):
        await ingest.count_window(ctx=ctx, rt=rt, window=w)


async def expire(
    *, ctx: AppContext, rt: StreamRuntime, epoch: int, now: datetime | None = None
) -> dict[str, int]:
    """Delete what left its period: hot data of sealed windows before the hot period, the
    tables of windows past retention, aggregates older than the previous epoch. Hot data of
    windows not yet sealed into the cold store is kept (the seal checkpoint is
    ``stream_window.cold_sealed_at``), and hot data is counted before it is deleted."""
    from service.ingest import service as ingest  # (ingest imports this module)

    store = store_of(ctx)
    now = now or datetime.now(UTC)
    hot_lo, _ = rt.hot_period(epoch)
    count_lo, _ = rt.count_period(epoch)
    ids = [t.id for t in rt.tables]
    deleted_hot = deleted_tables = 0
    async with ctx.sessionmaker() as session, session.begin():
        for w in await repository.windows_to_expire_hot(session, rt.id, hot_lo):
            await ingest.count_window(ctx=ctx, rt=rt, window=w.epoch)  # a no-op once counted
            await store.delete_hot(rt.name, w.epoch)
            w.hot_deleted_at = now
            deleted_hot += 1
        for w in await repository.windows_past_retention(session, rt.id, count_lo):
            await store.delete_tables(rt, w.epoch, ids)
            w.state, w.expired_at = "expired", now
            deleted_tables += 1
    await store.delete_aggs_before(rt.name, epoch - 1, oldest=epoch - 1 - 64)
    if deleted_hot:
        await store.rewrite_aof()
    return {"hot_windows_deleted": deleted_hot, "table_windows_deleted": deleted_tables}


async def prepare_next(*, ctx: AppContext, name: str) -> bool:
    """prepare_next_window: noise for the window after the open one, ahead of the roll."""
    rt = await streams.runtime(ctx=ctx, name=name)
    epoch = await store_of(ctx).epoch(name)
    if epoch is None:
        return False
    return await prepare(ctx=ctx, rt=rt, epoch=epoch + 1, state="prepared")


async def list_windows(
    *, ctx: AppContext, session: AsyncSession, name: str, limit: int
) -> WindowsOut:
    """Window states, newest first, with the period each belongs to at the current epoch."""
    row = await streams.get(session=session, name=name)
    rt = await streams.runtime(ctx=ctx, name=name)
    hot = rt.hot_period(row.epoch)
    count = rt.count_period(row.epoch)

    def period(e: int) -> str:
        if e == row.epoch:
            return "open"
        if hot[0] <= e <= hot[1]:
            return "hot"
        return "count" if count[0] <= e <= count[1] else "expired"

    return WindowsOut(
        epoch=row.epoch,
        served_epoch=await store_of(ctx).served(name),
        hot_period=hot,
        count_period=(max(count[0], 1), count[1]),
        windows=[
            WindowOut.model_validate(
                {
                    **{c: getattr(w, c) for c in WindowOut.model_fields if c != "period"},
                    "period": period(w.epoch),
                }
            )
            for w in await repository.windows_of(session, row.id, limit=limit)
        ],
    )


async def after_roll(*, ctx: AppContext, name: str, epoch: int) -> None:
    """Background work of a roll: the selection round, then the reference model. Failures are
    logged, never raised into the roll."""
    from service.reference import service as reference  # (both import this module)
    from service.selection import service as selection

    try:
        await selection.select_tables(ctx=ctx, name=name, epoch=epoch)
    except Exception as exc:
        log.error("selection of %s at epoch %d failed: %s", name, epoch, type(exc).__name__)
    await reference.after_roll(ctx=ctx, name=name, epoch=epoch)
