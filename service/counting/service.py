"""Counting (the worker's job, every ``count_seconds``; a roll counts what is left before a
window's tables join the count period, and expire counts before it deletes): hot rows accepted
by ingest are counted into their window's tables from a per-window checkpoint.

Every run of entries is parsed (``service.core.features.counting.parse_rows``), its increments
summed
per cell (``count_increments``) and applied together with the move of the window's checkpoint
by compare-and-set (``count.lua`` via ``ctx.stores.counting``), so every accepted row is
counted exactly once whatever crashes or races. A table with many increments is read, added to
in numpy and written whole (saturated as BITFIELD saturates); the others get their increments
as one string (``pack_ops``): redis-py packing hundreds of thousands of small arguments cost
more than the increments. The rows parsed by column go with them (``Keys.cols``): the train
set reads those instead of parsing JSON again."""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from typing import Any

import numpy as np

from service.context import AppContext
from service.core.features.counting import (
    Increments,
    count_increments,
    forget_keys,
    parse_rows,
    tables_of,
    within_bound,
)
from service.core.features.runtime import StreamRuntime
from service.errors import Unavailable
from service.streams import repository
from service.streams import service as streams

log = logging.getLogger("selectivity.counting")

COUNT_CHUNK = 20_000  # hot entries counted per compare-and-set
# A table with more increments than its cells / DENSE_RATIO is read, added to and written
# whole (two bulk strings) instead of incremented op by op (BITFIELD costs Redis ~1 µs an op;
# a whole table ~1 ns a cell).
DENSE_RATIO = 64
# At most this many increments are applied inside count.lua per run (~1-2 µs each there, and
# Redis serves nobody else meanwhile); beyond it the largest tables are staged whole instead.
SCRIPT_OPS_MAX = 10_000
COUNT_SECONDS_MAX = 30.0  # one counting call stops catching up after this long


def _added(inc: Increments, tables: list[int], whole: list[bytes]) -> list[bytes]:
    return [inc.added_to(i, b) for i, b in zip(tables, whole, strict=True)]


async def count_window(
    *,
    ctx: AppContext,
    rt: StreamRuntime,
    window: int,
    epoch: int | None = None,
    part: int | None = None,
) -> int:
    """Count window ``window``'s hot entries that are not counted yet into its tables, until
    none is left (for at most ``COUNT_SECONDS_MAX`` past the entries there were at the start);
    returns the number of entries counted by this call. Safe to run concurrently and to crash
    anywhere: each run of entries is applied together with the move of the window's
    checkpoint, by compare-and-set (``count.lua``), so every entry is counted exactly once; the
    rows parsed by column go with them (``Keys.cols``: the train set reads those). A window
    leaves the hot period only once it is counted to its end (``lifecycle.roll`` and
    ``lifecycle.expire`` call this first). ``epoch``: the stream's epoch, given by the counting
    job, whose runs reuse the digests of values hashed earlier in that epoch
    (``core.counting.hasher``). ``part``: only that part of the window (the counting job's
    share); None: every part, one after the other."""
    if part is None:
        total = 0
        for p in range(rt.parts):
            total += await _count_part(ctx=ctx, rt=rt, window=window, epoch=epoch, part=p)
        return total
    return await _count_part(ctx=ctx, rt=rt, window=window, epoch=epoch, part=part)


async def _count_part(
    *, ctx: AppContext, rt: StreamRuntime, window: int, epoch: int | None, part: int
) -> int:
    store = ctx.stores.counting
    windows = ctx.stores.windows
    p = part
    last = await windows.hot_last_id(rt.name, window, p)
    if last is None:
        return 0
    tables = tables_of(rt, window)
    table_ids = [t.id for t in tables]
    bound = rt.config.privacy.max_contributions_per_window
    users_ttl = ctx.settings.idempotency_ttl_seconds + rt.config.window_seconds * (
        rt.config.hot_windows + 1
    )
    deadline = time.monotonic() + COUNT_SECONDS_MAX
    total = 0
    expected = await store.counted(rt.name, window, p)
    while True:
        if entry_id(expected) >= entry_id(last):  # caught up: count what came meanwhile
            newer = await windows.hot_last_id(rt.name, window, p)
            if newer is None or newer == last or time.monotonic() > deadline:
                return total
            last = newer
        lasts, pops, chunk, stop = await _listed_run(ctx, rt.name, window, p, expected)
        if chunk is None:  # entries that are in no listed batch: their JSON one by one
            start = b"(" + expected if expected else "-"
            end = b"(" + stop if stop is not None and entry_id(stop) <= entry_id(last) else last
            chunk = await windows.hot_chunk(rt.name, window, start, end, COUNT_CHUNK, p)
            if chunk is None:
                return total
            pops = sum(1 for b in lasts if b <= entry_id(chunk[0]))  # batches it passed
        checkpoint, n, rows = chunk
        parsed, blob = await asyncio.to_thread(
            parse_rows, rt, rows, after=expected, last=checkpoint
        )
        users = b""
        counted = parsed
        if parsed.users is not None:
            seen = np.array(await store.seen(rt.name, window, parsed.user_ids, p), dtype=np.int64)
            mask, after = within_bound(parsed.users, seen, bound)
            counted = parsed.only(mask)
            changed = np.flatnonzero(after != seen)
            users = b" ".join(
                b"%s %d" % (parsed.user_ids[u].encode(), after[u]) for u in changed.tolist()
            )
        inc = await asyncio.to_thread(
            functools.partial(count_increments, cache_epoch=epoch),
            rt,
            tables,
            counted.encoded,
            counted.labels,
        )
        # Tables with many increments are written whole (the prior table never is), and so
        # are the largest others while the rest would hold Redis too long in count.lua.
        dense = [i for i in range(len(tables)) if inc.size(i) * DENSE_RATIO > rt.spec.cells]
        by_size = sorted(
            (i for i in range(len(tables)) if i not in dense), key=inc.size, reverse=True
        )
        ops = sum(inc.size(i) for i in by_size)
        for i in by_size:
            if ops <= SCRIPT_OPS_MAX:
                break
            dense.append(i)
            ops -= inc.size(i)
        values: dict[int, bytes] = {}
        token = secrets.token_hex(8)
        staged_ids = [table_ids[i] for i in dense]
        if dense:
            current, whole = await store.read_tables(
                stream=rt.name, window=window, table_ids=staged_ids, part=p
            )
            if current != expected:  # another counter moved on: start again from there
                expected = current
                continue
            present = [b for b in whole if b is not None]
            if len(present) < len(whole):
                raise Unavailable(
                    f"window {window} of stream {rt.name!r} has no tables to count into"
                )
            added = await asyncio.to_thread(_added, inc, dense, present)
            await store.stage(
                stream=rt.name,
                window=window,
                token=token,
                tables=dict(zip(staged_ids, added, strict=True)),
                part=p,
            )
            values = dict.fromkeys(dense, b"")
        sparse = [i for i in range(inc.n_tables) if i not in values]
        values.update(zip(sparse, inc.packed(sparse), strict=True))
        status, current_ = await store.count(
            stream=rt.name,
            window=window,
            expected=expected,
            checkpoint=checkpoint,
            table_ids=table_ids,
            staged=[i in dense for i in range(inc.n_tables)],
            values=[values[i] for i in range(inc.n_tables)],
            token=token,
            users=users,
            users_ttl=users_ttl,
            columns=blob,
            part=p,
            pops=pops,
        )
        if status != "ok":
            await store.unstage(
                stream=rt.name, window=window, token=token, table_ids=staged_ids, part=p
            )
        elif staged_ids:  # moved into place by the compare-and-set
            await store.done(stream=rt.name, window=window, token=token, part=p)
        if status == "missing" and b":stage:" in (current_ or b""):
            continue  # a staging key expired before the call: count the run again
        if status == "missing":
            raise Unavailable(f"window {window} of stream {rt.name!r} has no tables to count into")
        if status == "ok":
            total += n
            expected = checkpoint
        else:  # another counter moved the checkpoint: go on from where it got to
            expected = current_ or b""


LIST_STEP = 64  # listed batches read per look at the list


def entry_id(raw: bytes) -> tuple[int, int]:
    """A hot-stream entry id (``<ms>-<seq>``; b'' before the first) as a comparable pair."""
    if not raw:
        return (-1, -1)
    ms, _, seq = raw.partition(b"-")
    return int(ms), int(seq or 0)


async def _listed_run(
    ctx: AppContext, name: str, window: int, p: int, expected: bytes
) -> tuple[list[tuple[int, int]], int, tuple[bytes, int, bytes] | None, bytes | None]:
    """The batches ingest listed whole for counting (``Keys.batches``, in entry order) that
    continue the part's count from checkpoint ``expected``: ``(lasts, pops, run, stop)``.
    ``lasts``: the last entry id of each listed batch looked at (the list's head), so a count
    of entries read otherwise can pop those it passed. ``run``: ``(last entry id, entries,
    b'row,row,...')`` of the listed batches that follow ``expected`` with no entry between
    them (each batch's first entry is the entry right after the one before it: one pipelined
    look-up), up to about ``COUNT_CHUNK`` entries, and ``pops`` the batches at the head the
    run counts or the count has passed. None when the head does not continue the count; then
    ``stop`` is the first entry of the head when entries come before it that are in no listed
    batch (written by a version before the list: read as JSON, up to it), else None (the list
    is empty, or a JSON count stopped inside the head batch: read as JSON to its end)."""
    store = ctx.stores.counting
    heads = [raw.split(b" ") for raw in await store.batch_ids(name, window, p, 0, LIST_STEP - 1)]
    lasts = [entry_id(h[1]) for h in heads]
    done = entry_id(expected)
    passed = sum(1 for last in lasts if last <= done)  # in entry order: a prefix
    heads = heads[passed:]
    if not heads:
        return lasts, passed, None, None
    if entry_id(heads[0][0]) <= done:  # entered part way by a JSON count: JSON to its end
        return lasts, passed, None, None
    nexts = await store.next_ids(name, window, p, [expected] + [h[1] for h in heads[:-1]])
    n_run = entries = 0
    for h, after in zip(heads, nexts, strict=True):
        if after != h[0] or entries >= COUNT_CHUNK:
            break
        n_run += 1
        entries += int(h[2])
    if not n_run:
        return lasts, passed, None, heads[0][0]
    rows = await store.batches(name, window, p, passed, passed + n_run - 1)
    if len(rows) != n_run:  # (the hot data was deleted meanwhile)
        return lasts, passed, None, None
    return lasts, passed + n_run, (heads[n_run - 1][1], entries, b",".join(rows)), None


# A part of a stream of several parts is counted in runs of a fraction of the stream's rows,
# while a run's cost in Redis grows with the tables' cells as well as its rows (a dense table
# is read and written whole: ~2 ns a cell, 13 ms a run for 40 tables of 163,840 cells), so
# the counting job lets the open window's part gather rows first: it counts a part once
# LINGER_ROWS_PER_CELLS rows per table cell of the window are listed, or once the part's
# oldest row waiting is LINGER_SECONDS old. A roll, expiry and every other caller count at
# once. One-part streams count at once, as before parts.
LINGER_SECONDS = 3.0
LINGER_ROWS_PER_CELLS = 1 / 1000


async def _lingers(ctx: AppContext, rt: StreamRuntime, window: int, p: int) -> bool:
    """Whether the job should leave part ``p`` of the open window ``window`` for a later tick:
    few rows listed, and none waiting for ``LINGER_SECONDS`` (its oldest row not counted is
    younger; entries in no listed batch are counted at once)."""
    store = ctx.stores.counting
    expected = await store.counted(rt.name, window, p)
    oldest = (await store.next_ids(rt.name, window, p, [expected]))[0]
    if oldest is None:
        return False  # nothing to count
    if time.time() - entry_id(oldest)[0] / 1000 >= LINGER_SECONDS:
        return False
    listed = await store.batch_ids(rt.name, window, p, 0, LIST_STEP - 1)
    if not listed or listed[0].split(b" ", 1)[0] != oldest:
        return False  # entries in no listed batch come first
    rows = sum(int(h.split(b" ")[2]) for h in listed)
    cells = rt.spec.cells * (len(tables_of(rt, window)) + 1)
    return rows < cells * LINGER_ROWS_PER_CELLS


async def count_hot(
    *,
    ctx: AppContext,
    rt: StreamRuntime,
    epoch: int,
    part: int | None = None,
    linger: bool = False,
) -> int:
    """Count every window of the hot period of ``epoch`` (the open one included) up to now:
    part ``part`` of each, or every part (None). ``linger`` (the counting job, one part of a
    stream of several): the open window's part may be left to gather rows (``_lingers``)."""
    lo, hi = rt.hot_period(epoch)
    forget_keys(rt.hash_seed, before_epoch=epoch)  # values hashed before the last roll
    total = 0
    for w in range(max(lo, 1), hi + 1):
        lingering = linger and part is not None and rt.parts > 1 and w == hi
        if lingering and await _lingers(ctx, rt, w, part or 0):
            continue
        total += await count_window(ctx=ctx, rt=rt, window=w, epoch=epoch, part=part)
    return total


COUNT_JOB_TIMEOUT = 600  # one stream's counting job: catching up is bounded by COUNT_SECONDS_MAX


async def count_stream(ctx: AppContext, name: str, part: int = 0) -> int:
    """Count part ``part`` of stream ``name``'s hot windows: the entries accepted since the
    last run, into their window's tables (the worker's ``count_stream`` job); the number of
    entries counted. A part the stream does not have (its job outlived a re-creation of the
    stream with fewer parts) counts nothing."""
    epoch = await ctx.stores.windows.epoch(name)
    if epoch is None:
        return 0
    rt = await streams.runtime(ctx=ctx, name=name)
    if part >= rt.parts:
        return 0
    return await count_hot(ctx=ctx, rt=rt, epoch=epoch, part=part, linger=True)


def count_job_key(name: str, part: int) -> str:
    """The counting job's key: one job per (stream, part) is queued or running at a time."""
    return f"count:{name}" if part == 0 else f"count:{name}:{part}"


async def enqueue_all(ctx: AppContext) -> dict[str, int]:
    """The counting cron: one ``count_stream`` job per (stream, part), keyed by both
    (``count_job_key``; a part whose job is queued or running is skipped), so that the
    worker's slots and every worker of the deployment count different streams, and the parts
    of one stream, in parallel, while one part is never counted by two jobs at once (which
    would only race on its checkpoints). Part 0's job carries no ``part`` argument (one-part
    streams' jobs are as before parts existed)."""
    async with ctx.sessionmaker() as session:
        listed = [
            (s.name, int(s.config.get("partitions", 1)))
            for s in await repository.list_streams(session)
        ]
    enqueued = 0
    for name, parts in listed:
        for p in range(parts):
            part_arg: dict[str, Any] = {"part": p} if p else {}
            enqueued += await ctx.jobs.enqueue(
                "count_stream",
                key=count_job_key(name, p),
                timeout=COUNT_JOB_TIMEOUT,
                retries=0,  # the next tick enqueues it again
                stream=name,
                **part_arg,
            )
    return {"streams": len(listed), "enqueued": enqueued}


async def count_all(ctx: AppContext) -> dict[str, int]:
    """Every stream counted here (every part), one after the other (one stream's failure does
    not stop the others): what the worker's jobs do, inline, for tests and tools."""
    async with ctx.sessionmaker() as session:
        names = [s.name for s in await repository.list_streams(session)]
    counted = 0
    for name in names:
        try:
            epoch = await ctx.stores.windows.epoch(name)
            if epoch is not None:
                rt = await streams.runtime(ctx=ctx, name=name)
                counted += await count_hot(ctx=ctx, rt=rt, epoch=epoch)
        except Exception as exc:
            log.error("counting failed for stream %s: %s", name, type(exc).__name__)
    return {"streams": len(names), "counted": counted}
