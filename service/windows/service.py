"""Windows: noise-initialised tables prepared ahead of time (prepare_next_window), the
count-period aggregate of each epoch, window listings. The roll that moves a stream from one
window to the next, and expiry, are ``service.lifecycle``'s: they call several domains."""

from __future__ import annotations

import logging

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core.dp.noise import sample_noise
from service.core.features.runtime import StreamRuntime
from service.core.tables.aggregate import Aggregate
from service.core.tables.cells import INT32_MAX
from service.streams import repository
from service.streams import service as streams
from service.windows.schemas import WindowOut, WindowsOut

log = logging.getLogger("selectivity.windows")


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
    (``service.core.dp.noise``). Runs in the process pool."""

    def draw(scale: float, size: int) -> np.ndarray:
        if mechanism == "none":
            return np.zeros(size, dtype=np.int64)
        noise = sample_noise(mechanism=mechanism, scale=scale, size=size)  # type: ignore[arg-type]
        return np.clip(noise, -INT32_MAX, INT32_MAX, out=noise)

    tables = {tid: draw(scale, cells) for tid, scale in zip(table_ids, scales, strict=True)}
    return tables, draw(prior_scale, n_labels)


async def prepare(
    *, ctx: AppContext, rt: StreamRuntime, epoch: int, state: str = "prepared"
) -> bool:
    """Noise-initialise window ``epoch``'s tables (prepare_next_window). A no-op when the window
    is already prepared, open or closed; ``state='open'`` opens a prepared window."""
    store = ctx.stores.windows
    current = await store.state(rt.name, epoch)
    if current in ("open", "closed"):
        return False
    if current == "prepared":
        if state == "open":
            await store.set_state(rt.name, epoch, "open", parts=rt.parts)
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
    return await store.write_tables(rt.name, epoch, tables, prior, state=state, parts=rt.parts)


async def forget_leftovers(*, ctx: AppContext, name: str, parts: int = 1) -> None:
    """Before a new stream's first windows are prepared: drop window state and pointers that a
    creation of the same name left behind when its SQL transaction failed after writing to
    Redis (the name is new in SQL, so nothing under it in Redis is live)."""
    store = ctx.stores.windows
    await store.delete_meta(name, 1, parts=parts)
    await store.delete_meta(name, 2, parts=parts)
    await store.clear_pointers(name)


async def initialise_pointers(*, ctx: AppContext, rt: StreamRuntime) -> None:
    store = ctx.stores.windows
    lo, hi = rt.count_period(1)
    await store.write_agg(
        rt.name, Aggregate(1, lo, hi, [], [], np.zeros(rt.spec.n_labels, np.int64))
    )
    await store.set_epoch(rt.name, 1)
    await store.set_served(rt.name, 1)


async def update_aggregate(*, ctx: AppContext, rt: StreamRuntime, epoch: int) -> None:
    """Build the count-period aggregate of ``epoch`` unless it is built already, and serve it
    (move ``served`` to ``epoch``)."""
    await build_aggregate(ctx=ctx, rt=rt, epoch=epoch)
    await ctx.stores.windows.set_served(rt.name, epoch)


async def aggregate_ready(*, ctx: AppContext, rt: StreamRuntime, epoch: int) -> bool:
    """Whether the aggregate of ``epoch`` is stored for the count period ``epoch`` has now
    (two small reads: not the cells)."""
    span = await ctx.stores.windows.agg_span(rt.name, epoch)
    return span == rt.count_period(epoch)


async def build_aggregate(*, ctx: AppContext, rt: StreamRuntime, epoch: int) -> bool:
    """Store the count-period aggregate of ``epoch`` without serving it; False when it was
    stored already. Incrementally, ``agg(e) = agg(e−1) + entering − leaving`` (sketches are
    linear), or summed afresh when agg(e−1) is missing: one flat array, one MGET per window,
    O(tables), not O(data). Every window of the count period must be counted to its end
    (closed, and counted): the roll calls this after ``count_closed``, and
    ``lifecycle.followups.build_next`` after counting the entering window, which closed a roll
    earlier."""
    if await aggregate_ready(ctx=ctx, rt=rt, epoch=epoch):
        return False
    store = ctx.stores.windows
    lo, hi = rt.count_period(epoch)
    ids = [t.id for t in rt.tables]
    layout = [(tid, rt.spec.cells) for tid in ids]
    prev = await store.read_agg(rt.name, epoch - 1)
    if prev is None or (prev.lo, prev.hi) != (lo - 1, hi - 1):
        await _sum_afresh(ctx, rt, epoch, lo, hi, ids)
        return True
    cells = prev.aligned(layout, rt.spec.n_labels)
    windows = [w for w in prev.windows if w >= lo]
    for w in (w for w in prev.windows if w < lo):
        leaving = await store.read_window(rt.name, w, ids, cells=rt.spec.cells, parts=rt.parts)
        if leaving is None:  # deleted already: cannot subtract, so sum afresh
            await _sum_afresh(ctx, rt, epoch, lo, hi, ids)
            return True
        cells -= leaving
    if hi >= 1 and hi not in windows:
        entering = await store.read_window(rt.name, hi, ids, cells=rt.spec.cells, parts=rt.parts)
        if entering is not None:
            cells += entering
            windows.append(hi)
    await store.write_agg(rt.name, Aggregate(epoch, lo, hi, sorted(windows), layout, cells))
    return True


async def trim_aggregate(*, ctx: AppContext, rt: StreamRuntime, epoch: int) -> None:
    """Take out of the served aggregate of ``epoch`` − 1 the windows that leave the count
    period at the roll to ``epoch`` (window ``epoch`` − H − R), so that their tables can be
    deleted before window ``epoch`` takes counts while featurize goes on serving ``epoch`` − 1
    (over one window fewer) until the roll serves ``epoch``: the roll's way when the
    aggregate of ``epoch`` cannot be built first (one hot window: the window entering the
    count period is the one the roll closes). A no-op once trimmed; if a leaving window's
    tables are gone already, the aggregate is deleted instead (nothing could subtract them;
    featurize answers 503 until the roll serves ``epoch``)."""
    store = ctx.stores.windows
    prev = await store.read_agg(rt.name, epoch - 1)
    lo = rt.count_period(epoch)[0]
    if prev is None or all(w >= lo for w in prev.windows):
        return
    cells = prev.cells.copy()
    ids = [tid for tid, _ in prev.layout]
    for w in (w for w in prev.windows if w < lo):
        leaving = await store.read_window(rt.name, w, ids, cells=rt.spec.cells, parts=rt.parts)
        if leaving is None or leaving.size != cells.size:
            await store.delete_agg(rt.name, epoch - 1)
            return
        cells -= leaving
    kept = [w for w in prev.windows if w >= lo]
    await store.write_agg(
        rt.name, Aggregate(prev.epoch, prev.lo, prev.hi, kept, prev.layout, cells)
    )


async def drop_leaving(*, ctx: AppContext, rt: StreamRuntime, epoch: int) -> None:
    """Before window ``epoch`` takes counts (the roll to ``epoch``): delete the tables of the
    window that leaves the count period (``epoch`` − H − R) and every aggregate older than
    the served one, so that Redis never holds more than R + H windows' tables, nor anything
    from which another window could be recovered (docs/ARCHITECTURE.md, "Life cycle"). The
    caller has moved ``served`` to ``epoch`` or trimmed the aggregate of ``epoch`` − 1
    (``trim_aggregate``)."""
    store = ctx.stores.windows
    served = await store.served(rt.name)
    leaving = rt.count_period(epoch)[0] - 1
    if served is not None:
        await store.delete_aggs_before(rt.name, served, oldest=served - 64)
    if leaving >= 1:
        await store.delete_tables(rt.name, leaving, [t.id for t in rt.tables], parts=rt.parts)


async def build_next(*, ctx: AppContext, rt: StreamRuntime, epoch: int) -> bool:
    """Ahead of the roll to ``epoch`` + 1 (a follow-up of the roll to ``epoch``): build the
    aggregate that roll will serve, so that the roll itself only moves the ``served`` pointer.
    Possible when ``hot_windows`` ≥ 2: the window that enters the count period at the next
    roll, ``epoch + 1 − hot_windows``, closed at the roll to ``epoch`` or earlier; the
    caller counts it to its end first (closed windows take no entries; the roll that closed
    it leaves its tail to ``lifecycle.followups.build_next``). With one hot window the entering
    window is the open one, so the roll builds the aggregate itself. False when there is
    nothing to do (one hot window, built already, or the stream moved on: then the roll that
    moved it built it)."""
    if rt.config.hot_windows < 2:
        return False
    store = ctx.stores.windows
    if await store.epoch(rt.name) != epoch:
        return False
    # If the stream rolls on meanwhile, that roll builds (or finds) the same aggregate; one
    # written after the stream serves a later epoch never lands (``WindowStore.write_agg``).
    return await build_aggregate(ctx=ctx, rt=rt, epoch=epoch + 1)


async def _sum_afresh(
    ctx: AppContext, rt: StreamRuntime, epoch: int, lo: int, hi: int, ids: list[int]
) -> None:
    store = ctx.stores.windows
    layout = [(tid, rt.spec.cells) for tid in ids]
    cells = np.zeros(rt.spec.cells * len(ids) + rt.spec.n_labels, np.int64)
    windows: list[int] = []
    for w in range(max(lo, 1), hi + 1):
        flat = await store.read_window(rt.name, w, ids, cells=rt.spec.cells, parts=rt.parts)
        if flat is None:
            continue
        cells += flat
        windows.append(w)
    await store.write_agg(rt.name, Aggregate(epoch, lo, hi, windows, layout, cells))


async def prepare_next(*, ctx: AppContext, name: str) -> bool:
    """prepare_next_window: noise for the window after the open one, ahead of the roll."""
    rt = await streams.runtime(ctx=ctx, name=name)
    epoch = await ctx.stores.windows.epoch(name)
    if epoch is None:
        return False
    return await prepare(ctx=ctx, rt=rt, epoch=epoch + 1, state="prepared")


async def list_windows(
    *, ctx: AppContext, session: AsyncSession, name: str, limit: int
) -> WindowsOut:
    """Window states, newest first, with the period each belongs to at the current epoch.
    ``observations`` is counted live (the hot stream's length) for windows of the hot period
    and is null for the others: an exact count is raw-data derived, so it is shown only while
    the window's raw rows may be (docs/PRIVACY.md, promise 1) and is never stored."""
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

    store = ctx.stores.windows
    computed = ("period", "observations")
    windows = []
    for w in await repository.windows_of(session, row.id, limit=limit):
        p = period(w.epoch)
        stored = {c: getattr(w, c) for c in WindowOut.model_fields if c not in computed}
        live = (
            await store.hot_length(name, w.epoch, parts=rt.parts) if p in ("open", "hot") else None
        )
        windows.append(WindowOut.model_validate({**stored, "period": p, "observations": live}))
    return WindowsOut(
        epoch=row.epoch,
        served_epoch=await store.served(name),
        hot_period=hot,
        count_period=(max(count[0], 1), count[1]),
        windows=windows,
    )
