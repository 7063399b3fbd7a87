"""featurize and getTrainSet over exactly the count period of the served epoch
(docs/ARCHITECTURE.md, "Data path", "Featurization").

API processes cache the count-period aggregate in memory, keyed by epoch: one Redis GET of the
``served`` pointer per request. The next epoch's aggregate is loaded in the background as soon
as it is built ahead of the roll (``hot_windows`` ≥ 2), so featurize moves to the new epoch
with the pointer; otherwise the first request after the roll reads it."""

from __future__ import annotations

import asyncio
import io
import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Literal, cast

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from service.context import AppContext
from service.core.features import hotrows
from service.core.features.columns import prior_probabilities
from service.core.features.featurizer import Featurizer
from service.core.tables import cells as cell_codec
from service.errors import PayloadTooLarge, Unavailable
from service.features import pointer
from service.streams import service as streams
from service.streams.validation import check_rows

log = logging.getLogger("selectivity.features")

TRAINSET_CHUNK = 5000
IPC_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # continuation marker, length 0
TRAINSET_PARALLEL = 2  # chunks featurized at once by one train-set download


class AggregateGone(Unavailable):
    """The aggregate of the epoch this process took as served is deleted: the stream rolled
    and expiry deleted it (``pointer`` caches the epoch for ``FRESH_SECONDS``)."""


async def featurizer(*, ctx: AppContext, name: str) -> Featurizer:
    """The featurizer of the served epoch. If this process's cached pointer is behind and the
    aggregate it names is deleted already (the roll deletes every aggregate older than the
    one it serves), the pointer is read again and the current epoch served; a 503 to retry
    only if the pointer has not moved (the aggregate is missing for another reason)."""
    try:
        return await _featurizer(ctx=ctx, name=name)
    except AggregateGone:
        fresh = await ctx.stores.windows.served(name)
        if fresh is None or fresh == pointer.cached(ctx, name):
            raise
        pointer.moved(ctx, name, fresh)
        return await _featurizer(ctx=ctx, name=name)


async def _featurizer(*, ctx: AppContext, name: str) -> Featurizer:
    served = await pointer.served(ctx, name)
    stream_rt = await streams.runtime(ctx=ctx, name=name)  # 404 for a stream that does not exist
    if served is None:
        raise Unavailable(f"stream {name!r} has no count period yet; retry shortly")
    cache = ctx.caches.featurizers  # name -> (the stream's runtime, its featurizer)
    entry = cache.get(name)
    if entry is not None and entry[0] is stream_rt and entry[1].epoch == served:
        return entry[1]  # (``counted_at`` is not called again: a loop over the tables)
    rt = stream_rt.counted_at(served)
    hit = entry[1] if entry is not None else None
    if hit is not None and hit.epoch == served and hit.rt is rt:
        cache[name] = (stream_rt, hit)
        return hit
    base: Featurizer
    if hit is not None and hit.epoch == served:
        base = hit
    else:
        base = await asyncio.shield(_loading(ctx, name, served))
        entry = ctx.caches.featurizers_ahead.get(name)
        if entry is not None and entry[0] <= served:
            del ctx.caches.featurizers_ahead[name]
    fz = base if base.rt is rt else Featurizer.build(rt, base.agg, previous=base)
    cache[name] = (stream_rt, fz)
    _load_ahead_soon(ctx, name, served)
    return fz


# how often a process that serves a stream looks for the next epoch's aggregate (two small
# reads): the loading (0.3-0.6 s at 100 tables) then starts within this of the aggregate being
# built, so it ends before the roll unless the roll follows the build by less than ~0.7 s
AHEAD_POLL_SECONDS = 0.1


def _loading(ctx: AppContext, name: str, epoch: int) -> asyncio.Task[Featurizer]:
    """The one task of this process that reads the aggregate of ``epoch`` and builds its
    featurizer: requests that need it while it runs (the first ones after a roll), and the
    background load ahead of the roll, all wait for the same read."""
    entry = ctx.caches.featurizers_ahead.get(name)
    if entry is not None and entry[0] == epoch:
        task: asyncio.Task[Featurizer] = entry[1]
        if not task.done() or task.exception() is None:
            return task
    task = asyncio.create_task(_read_and_build(ctx, name, epoch))
    ctx.caches.featurizers_ahead[name] = (epoch, task)
    return task


async def _read_and_build(ctx: AppContext, name: str, epoch: int) -> Featurizer:
    agg = await ctx.stores.windows.read_agg(name, epoch)
    if agg is None:
        raise AggregateGone(f"aggregate of epoch {epoch} of {name!r} is missing; retry")
    rt = (await streams.runtime(ctx=ctx, name=name)).counted_at(epoch)
    return await asyncio.to_thread(Featurizer.build, rt, agg)


# How often each API process drops the featurizers of epochs no longer served
# (``sweep_forever``, started by the API's lifespan).
SWEEP_SECONDS = 5.0


async def drop_stale(ctx: AppContext) -> int:
    """Drop this process's featurizers of epochs no longer served: the served one behind the
    ``served`` pointer (a roll moved it, here or in another process) and any built ahead for an
    epoch before it. Without this, a process keeps the previous epoch's aggregate (noisy
    tables of a window that left the count period) until its next request for the stream,
    which for an idle stream is never: the one-time reader of process memory would read one
    window more than R + H (docs/PRIVACY.md). Its arrays are large, so freeing them returns
    their pages to the system. Returns how many were dropped."""
    dropped = 0
    store = ctx.stores.windows
    names = set(ctx.caches.featurizers) | set(ctx.caches.featurizers_ahead)
    for name in names:
        served = await store.served(name)
        # (read after the await: what a request put there meanwhile is judged, not missed)
        entry = ctx.caches.featurizers.get(name)
        if entry is not None and (served is None or entry[1].epoch != served):
            del ctx.caches.featurizers[name]
            dropped += 1
        ahead = ctx.caches.featurizers_ahead.get(name)
        if ahead is not None and (served is None or ahead[0] < served):
            del ctx.caches.featurizers_ahead[name]
            dropped += 1
    return dropped


async def sweep_forever(ctx: AppContext) -> None:
    """``drop_stale`` every ``SWEEP_SECONDS``."""
    while True:
        await asyncio.sleep(SWEEP_SECONDS)
        try:
            await drop_stale(ctx)
        except Exception as exc:  # Redis away for a while: the next sweep tries again
            log.warning("dropping stale featurizers failed: %s", type(exc).__name__)


def _load_ahead_soon(ctx: AppContext, name: str, epoch: int) -> None:
    """Wait in the background for the aggregate of ``epoch`` + 1 (built ahead of the roll when
    the stream has two or more hot windows, ``windows.build_next``) and load its featurizer,
    so that the first featurize after the roll does not wait for a read of every table
    (65 MB at 100 tables). One task per stream and process; it ends once the epoch moves."""
    task = ctx.caches.background.get(f"ahead:{name}")
    if task is not None and not task.done():
        return
    ctx.caches.background[f"ahead:{name}"] = asyncio.create_task(_load_ahead(ctx, name, epoch))


async def _load_ahead(ctx: AppContext, name: str, epoch: int) -> None:
    store = ctx.stores.windows
    try:
        while await store.served(name) == epoch:
            if await store.agg_span(name, epoch + 1) is not None:
                await _loading(ctx, name, epoch + 1)
                return
            await asyncio.sleep(AHEAD_POLL_SECONDS)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the next featurize after the roll reads the aggregate itself
        log.warning("loading the next aggregate of %s failed: %s", name, type(exc).__name__)


async def featurize(*, ctx: AppContext, name: str, rows: Sequence[Mapping[str, object]]) -> dict:
    if len(rows) > ctx.settings.max_batch:
        raise PayloadTooLarge(f"rows: {len(rows)} exceeds the limit of {ctx.settings.max_batch}")
    fz = await featurizer(ctx=ctx, name=name)
    check_rows(fz.rt, rows, where="rows", max_string=ctx.settings.max_string_length)
    matrix = fz.transform(rows) if len(rows) < 2000 else await asyncio.to_thread(fz.transform, rows)
    out = {"epoch": fz.epoch, "columns": fz.output_columns, "rows": matrix}
    if fz.value_columns:  # categorical passthrough: strings after the float columns
        out["values"] = fz.values(rows)
    return out


async def label_rates(*, ctx: AppContext, name: str, half_life: float) -> dict:
    """The label rate's history the service holds: each window of the served epoch's count
    period with its noisy prior table (label counts), and rates pooled over them, recent
    windows weighted more (``half_life`` windows). A model trained on the hot period inherits
    its base rate; a client that expects the rate to move can shift its predictions toward
    ``recent`` (docs/USING.md, "Base rate"). Only windows of the count period: their tables
    are final, already released (each window's noisy tables, within its ε: post-processing,
    no further cost); an open window's table is noise plus a running count, and two reads of it
    would give the rows between them exactly, so none is read."""
    fz = await featurizer(ctx=ctx, name=name)
    rt = fz.rt
    windows = list(fz.agg.windows)
    # ≤ retention_windows, L cells each. One part: MGETs of 1,000 windows (Redis serves
    # others between them); several: a window's counts are the sum over its parts (part 0
    # holds the noise) or part 0 alone once folded, read as every reader reads them
    sums: list[np.ndarray | None] = []
    if rt.parts == 1:
        keys = [ctx.keys.prior(name, w) for w in windows]
        for i in range(0, len(keys), 1000):
            raw = cast(list[bytes | None], await ctx.redis.mget(keys[i : i + 1000]))
            sums += [None if b is None else cell_codec.decode(b) for b in raw]
    else:
        store = ctx.stores.windows
        for w in windows:
            sums.append(await store.read_window(name, w, [], cells=0, parts=rt.parts))
    labels = rt.labels
    kept = [(w, c) for w, c in zip(windows, sums, strict=True) if c is not None]
    pooled = np.zeros(len(labels))
    recent = np.zeros(len(labels))
    out = []
    for age, (w, counts) in enumerate(reversed(kept)):
        clipped = np.maximum(counts.astype(np.float64), 0.0)
        pooled += clipped
        recent += clipped * 2.0 ** (-age / half_life)
        rates = prior_probabilities(counts)
        out.append(
            {
                "window": w,
                "counts": dict(zip(labels, map(int, counts), strict=True)),
                "rates": dict(zip(labels, map(float, rates), strict=True)),
            }
        )
    return {
        "epoch": fz.epoch,
        "half_life_windows": half_life,
        "noise_sd": math.sqrt(rt.noise.variance_for(rt.prior_weight)),
        "windows": out[::-1],
        "recent": dict(zip(labels, map(float, prior_probabilities(recent)), strict=True)),
        "pooled": dict(zip(labels, map(float, prior_probabilities(pooled)), strict=True)),
    }


def featurize_json(out: dict) -> bytes:
    """``featurize``'s answer as JSON: the matrix written by orjson straight from numpy, a
    missing passthrough value (NaN) as null, as orjson writes NaN (byte for byte what
    converting NaN to None first gave, without the object array; a test pins it). With
    categorical passthrough values (``values``, column by column), each row is the matrix's
    row followed by its values (strings, null when missing)."""
    values = out.get("values")
    if values:
        rows = [
            [*floats, *strings]
            for floats, strings in zip(out["rows"].tolist(), zip(*values, strict=True), strict=True)
        ]
        body = {k: v for k, v in out.items() if k != "values"}
        return orjson.dumps({**body, "rows": rows})
    matrix = np.ascontiguousarray(out["rows"])  # (orjson takes C-contiguous arrays only)
    return orjson.dumps({**out, "rows": matrix}, option=orjson.OPT_SERIALIZE_NUMPY)


Format = Literal["arrow", "parquet", "ndjson"]
MEDIA_TYPES = {
    "arrow": "application/vnd.apache.arrow.stream",
    "parquet": "application/vnd.apache.parquet",
    "ndjson": "application/x-ndjson",
}


def _schema(fz: Featurizer) -> pa.Schema:
    fields = [
        pa.field("id", pa.string()),
        pa.field("event_time", pa.string()),
        pa.field("window", pa.int64()),
        pa.field("label", pa.string()),
    ]
    fields += [pa.field(c, pa.float64()) for c in fz.columns]
    fields += [pa.field(c, pa.string()) for c in fz.value_columns]
    return pa.schema(fields, metadata={"selectivity.epoch": str(fz.epoch)})


async def train_batches(ctx: AppContext, fz: Featurizer) -> AsyncIterator[pa.RecordBatch]:
    """The hot period of the served epoch, window by window (each window part by part) up to
    a snapshot of each part's last entry, featurized run by run (never built whole in
    memory). The rows the counting job has counted come by column, as it parsed them
    (``Keys.cols``: Arrow IPC, one per counted run, in order); the rest arrive as chunks of
    JSON rows (``WindowStore.hot_chunk``), parsed here. Each run is featurized into record
    batches in a worker thread while the next is read, up to ``TRAINSET_PARALLEL`` at once
    (most of the work is numpy, which releases the GIL); batches come out in order."""
    windows = ctx.stores.windows
    rt = fz.rt
    schema = _schema(fz)
    lo, hi = rt.hot_period(fz.epoch)
    working: deque[asyncio.Future[list[pa.RecordBatch]]] = deque()
    ahead: asyncio.Future[tuple[bytes, int, bytes] | None] | None = None

    def start(job: Callable[..., list[pa.RecordBatch]], *args: object) -> None:
        working.append(asyncio.ensure_future(asyncio.to_thread(job, fz, schema, *args)))

    try:
        # window by window, each window part by part
        for w, p in ((w, p) for w in range(max(lo, 1), hi + 1) for p in range(rt.parts)):
            runs = await windows.cols_length(rt.name, w, p)  # before the last entry: runs ≤ it
            last = await windows.hot_last_id(rt.name, w, p)
            if last is None:
                continue
            covered = b""  # the last entry of the counted runs read
            for i in range(runs):
                blob = await windows.cols_at(rt.name, w, i, p)
                if blob is None:
                    break  # expired under us
                after, run_last = hotrows.bounds_of(blob)
                if after != covered:
                    break  # not contiguous (runs from before counting kept them): read JSON
                start(_counted_batches, w, blob)
                covered = run_last
                while len(working) >= TRAINSET_PARALLEL:
                    for batch in await working.popleft():
                        yield batch
            if covered == last:
                continue
            begin = b"(" + covered if covered else "-"
            ahead = asyncio.ensure_future(
                windows.hot_chunk(rt.name, w, begin, last, TRAINSET_CHUNK, p)
            )
            while True:
                chunk = await ahead
                if chunk is None:
                    break
                last_read, n, rows = chunk
                more = last_read != last and n >= TRAINSET_CHUNK
                if more:  # read the next chunk while this one is featurized
                    ahead = asyncio.ensure_future(
                        windows.hot_chunk(rt.name, w, b"(" + last_read, last, TRAINSET_CHUNK, p)
                    )
                start(_json_batches, w, rows)
                while len(working) >= TRAINSET_PARALLEL:
                    for batch in await working.popleft():
                        yield batch
                if not more:
                    break
        while working:
            for batch in await working.popleft():
                yield batch
    finally:  # the consumer stopped early: drop the read ahead and the batches not taken
        if ahead is not None:
            ahead.cancel()  # (a no-op when done)
        for job in working:
            job.cancel()


def _json_batches(
    fz: Featurizer, schema: pa.Schema, window: int, rows: bytes
) -> list[pa.RecordBatch]:
    """One chunk of hot rows (``row,row,...`` JSON) → record batches of the train set."""
    specs = {f.name: f for f in fz.rt.features}
    chunk = hotrows.parse_chunk(
        rows, encode=[specs[f] for f in fz.encoded_features], passthrough=fz.rt.passthrough
    )
    return _batches(fz, schema, window, chunk)


def _counted_batches(
    fz: Featurizer, schema: pa.Schema, window: int, blob: bytes
) -> list[pa.RecordBatch]:
    """One counted run (``hotrows.to_ipc``) → record batches of the train set."""
    run = hotrows.from_ipc(blob, encode=fz.encoded_features, passthrough=fz.rt.passthrough)
    return _batches(fz, schema, window, run.chunk)


def _batches(
    fz: Featurizer, schema: pa.Schema, window: int, chunk: hotrows.Chunk
) -> list[pa.RecordBatch]:
    """A chunk featurized: record batches of at most ``TRAINSET_CHUNK`` rows."""
    columns = fz.transform_encoded(chunk.encoded, chunk.raw, chunk.n_rows, by_column=True)
    arrays = [
        chunk.ids,
        chunk.times,
        pa.array(np.full(chunk.n_rows, window, np.int64)),
        chunk.labels,
    ]
    arrays += [pa.array(col) for col in columns]
    arrays += fz.value_arrays(chunk.encoded)
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    return [batch.slice(i, TRAINSET_CHUNK) for i in range(0, max(chunk.n_rows, 1), TRAINSET_CHUNK)]


async def trainset(
    *, ctx: AppContext, name: str, fmt: Format
) -> tuple[int, AsyncIterator[bytes | memoryview]]:
    fz = await featurizer(ctx=ctx, name=name)
    schema = _schema(fz)

    async def arrow() -> AsyncIterator[bytes | memoryview]:
        """The IPC stream format written message by message, each straight from the buffer
        Arrow serialises it into (byte for byte what ``pa.ipc.new_stream`` writes)."""
        yield memoryview(schema.serialize())
        async for batch in train_batches(ctx, fz):
            yield memoryview(batch.serialize())
        yield IPC_END_OF_STREAM

    async def parquet() -> AsyncIterator[bytes | memoryview]:
        buf = io.BytesIO()
        writer = pq.ParquetWriter(buf, schema)
        async for batch in train_batches(ctx, fz):
            writer.write_table(pa.Table.from_batches([batch]))
            yield _drain(buf)
        writer.close()
        yield _drain(buf)

    async def ndjson() -> AsyncIterator[bytes | memoryview]:
        names = schema.names
        async for batch in train_batches(ctx, fz):
            cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
            lines = [
                orjson.dumps(dict(zip(names, vals, strict=True)))
                for vals in zip(*cols, strict=True)
            ]
            yield b"\n".join(lines) + b"\n"

    return fz.epoch, {"arrow": arrow, "parquet": parquet, "ndjson": ndjson}[fmt]()


def _drain(buf: io.BytesIO) -> bytes:
    data = buf.getvalue()
    buf.seek(0)
    buf.truncate()
    return data
