"""featurize and getTrainSet over exactly the count period of the served epoch (DESIGN §3, §4).

API processes cache the count-period aggregate in memory, keyed by epoch: one Redis GET of the
``served`` pointer per request, and one read of the aggregate when the epoch moves."""

from __future__ import annotations

import asyncio
import io
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from service.context import AppContext
from service.core.featurize import (
    SEPARATOR,
    Encoded,
    assemble,
    backoff_threshold,
    canonical_value,
    column_names,
    combine_codes,
    derived_columns,
    encode_column,
    passthrough_values,
    prior_probabilities,
)
from service.core.sketch import KeyHasher, estimate_stacked
from service.errors import PayloadTooLarge, Unavailable
from service.features import hotrows
from service.features.validation import check_rows
from service.streams import service as streams
from service.streams.runtime import StreamRuntime
from service.windows.service import store_of
from service.windows.store import Aggregate

TRAINSET_CHUNK = 5000
IPC_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # continuation marker, length 0
TRAINSET_PARALLEL = 2  # chunks featurized at once by one train-set download


ROW_BLOCK = 1 << 16  # rows assembled at a time (bounds the temporaries of a big batch)
FEW_ROWS = 8  # up to this many rows, featurize key by key (see Featurizer._transform_few)


@dataclass(frozen=True)
class Featurizer:
    """Everything needed to featurize rows at one epoch, in memory.

    ``transform`` hashes each distinct value of a batch once per table (``KeyHasher``), reads the
    count estimates of those distinct keys for all tables with one gather from the aggregate
    (``estimate_stacked``), derives their columns once, and expands them to the rows with one
    take per block of rows: per-row work is a dict lookup per value and a copy of the output.
    """

    rt: StreamRuntime
    agg: Aggregate
    columns: list[str]
    prior: np.ndarray
    thresholds: np.ndarray  # per table of rt.tables: its noise's back-off threshold
    cells: np.ndarray = field(repr=False, compare=False)  # tables one after another, int64
    offsets: np.ndarray = field(repr=False, compare=False)  # start of each of rt.tables
    hasher: KeyHasher = field(repr=False, compare=False)

    @classmethod
    def build(
        cls, rt: StreamRuntime, agg: Aggregate, *, previous: Featurizer | None = None
    ) -> Featurizer:
        """``previous``: a featurizer of the same aggregate, whose stacked cells are reused
        when its tables are the same (the runtime is refreshed every few seconds)."""
        cfg = rt.config
        if (
            previous is not None
            and previous.agg is agg
            and [t.id for t in previous.rt.tables] == [t.id for t in rt.tables]
        ):
            cells, offsets = previous.cells, previous.offsets
        else:
            cells, offsets = _stack(rt, agg)
        return cls(
            rt=rt,
            agg=agg,
            columns=column_names([t.name for t in rt.tables], rt.labels, rt.passthrough),
            prior=prior_probabilities(agg.prior),
            thresholds=np.array(
                [
                    backoff_threshold(
                        noise_variance=rt.noise.variance_for(rt.weight_of(t)),
                        n_windows=agg.n_windows,
                        n_labels=len(rt.labels),
                        sigmas=cfg.featurize.backoff_sigmas,
                    )
                    for t in rt.tables
                ],
                dtype=np.float64,
            ),
            cells=cells,
            offsets=offsets,
            hasher=KeyHasher(seed=rt.hash_seed, spec=rt.spec),
        )

    @property
    def epoch(self) -> int:
        return self.agg.epoch

    def transform(self, rows: Sequence[Mapping[str, object]]) -> np.ndarray:
        """Rows (feature name → value; missing features are null) → ``(n, len(columns))``."""
        if 0 < len(rows) <= FEW_ROWS:
            return self._transform_few(rows)
        rt = self.rt
        names = {f for t in rt.tables for f in t.features} | set(rt.passthrough)
        columns = {name: [r.get(name) for r in rows] for name in names}
        return self.transform_columns(columns, len(rows))

    def transform_columns(self, columns: Mapping[str, Sequence[object]], n_rows: int) -> np.ndarray:
        """The same from columns (feature name → ``n_rows`` values; an absent name is null)."""
        encoded, raw = self.encode_columns(columns, n_rows)
        return self.transform_encoded(encoded, raw, n_rows)

    def encode_columns(
        self, columns: Mapping[str, Sequence[object]], n_rows: int
    ) -> tuple[dict[str, Encoded], list[np.ndarray]]:
        """Codes of every feature a table uses (``encode_column``) and the passthrough values,
        the input of ``transform_encoded``."""
        missing: list[object] = [None] * n_rows

        def column(name: str) -> Sequence[object]:
            col = columns.get(name)
            return missing if col is None else col

        specs = {f.name: f for f in self.rt.features}
        encoded = {f: encode_column(column(f), specs[f]) for f in self.encoded_features}
        return encoded, [passthrough_values(column(f)) for f in self.rt.passthrough]

    @property
    def encoded_features(self) -> list[str]:
        """The features some table reads, in the order of the tables."""
        return list(dict.fromkeys(f for t in self.rt.tables for f in t.features))

    def transform_encoded(
        self,
        encoded: Mapping[str, Encoded],
        raw: Sequence[np.ndarray],
        n_rows: int,
        *,
        by_column: bool = False,
    ) -> np.ndarray:
        """``transform`` from each feature's codes (``encode_column``; every feature of
        ``encoded_features``) and the passthrough columns' values: ``(n_rows, len(columns))``,
        or with ``by_column`` its transpose ``(len(columns), n_rows)``, C-contiguous (each
        column one flat array, as Arrow takes them)."""
        rt, spec = self.rt, self.rt.spec
        per_table = [combine_codes([encoded[f] for f in t.features]) for t in rt.tables]
        sizes = np.array([len(e.keys) for e in per_table], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        buckets, signs = self.hasher.hash_many(
            [(t.name, e.keys) for t, e in zip(rt.tables, per_table, strict=True)]
        )
        est = estimate_stacked(self.cells, np.repeat(self.offsets, sizes), buckets, signs, spec)
        derived = _per_key_block(
            est,
            prior=self.prior,
            alpha=rt.config.featurize.alpha,
            threshold=np.repeat(self.thresholds, sizes),
        )
        n_tab, width = len(rt.tables), derived.shape[1]
        if by_column:
            out_t = np.empty((n_tab * width + len(raw), n_rows), dtype=np.float64)
            if n_rows and per_table:
                derived_t = np.ascontiguousarray(derived.T)  # (width, keys): rows are columns
                for j, e in enumerate(per_table):
                    block = out_t[j * width : (j + 1) * width]
                    np.take(derived_t, e.codes + starts[j], axis=1, out=block, mode="clip")
            for k, values in enumerate(raw):
                out_t[n_tab * width + k] = values
            return out_t
        out = np.empty((n_rows, n_tab * width + len(raw)), dtype=np.float64)
        if n_rows and per_table:
            # Block by block: each row's key in every table, then one take of their derived
            # columns, straight into the output when it has no passthrough columns (a 1M-row
            # batch writes ~1 GB: temporaries of that size would double the page faults).
            m = min(ROW_BLOCK, n_rows)
            index = np.empty((m, n_tab), dtype=np.int64)
            staging = None if not raw else np.empty((m * n_tab, width), dtype=np.float64)
            for lo in range(0, n_rows, ROW_BLOCK):
                hi = min(lo + ROW_BLOCK, n_rows)
                rows_here = index[: hi - lo]
                for j, e in enumerate(per_table):
                    np.add(e.codes[lo:hi], starts[j], out=rows_here[:, j])
                flat = rows_here.reshape(-1)
                if staging is None:
                    target = out[lo:hi].reshape(-1, width)  # a view: out is C-contiguous
                    np.take(derived, flat, axis=0, out=target, mode="clip")
                else:
                    part = staging[: flat.size]
                    np.take(derived, flat, axis=0, out=part, mode="clip")
                    out[lo:hi, : n_tab * width] = part.reshape(hi - lo, n_tab * width)
        if raw:
            out[:, n_tab * width :] = np.stack(raw, axis=1)
        return out

    def _transform_few(self, rows: Sequence[Mapping[str, object]]) -> np.ndarray:
        """``transform`` of a handful of rows (a featurize request's usual size): the same
        canonical keys, hashes and estimates, without the per-feature encoding arrays, whose
        numpy calls would cost more than the rows."""
        rt, spec = self.rt, self.rt.spec
        specs = {f.name: f for f in rt.features}
        groups = []
        for t in rt.tables:
            if len(t.features) == 1:
                one = specs[t.features[0]]
                keys = [canonical_value(r.get(one.name), one) for r in rows]
            else:
                fs = [specs[name] for name in t.features]
                keys = [SEPARATOR.join(canonical_value(r.get(f.name), f) for f in fs) for r in rows]
            groups.append((t.name, keys))
        n, n_tab = len(rows), len(rt.tables)
        buckets, signs = self.hasher.hash_many(groups)  # table-major: key j*n + i is row i
        est = estimate_stacked(self.cells, np.repeat(self.offsets, n), buckets, signs, spec)
        derived = _per_key_block(
            est,
            prior=self.prior,
            alpha=rt.config.featurize.alpha,
            threshold=np.repeat(self.thresholds, n),
        )
        width = derived.shape[1]
        out = np.empty((n, n_tab * width + len(rt.passthrough)), dtype=np.float64)
        out[:, : n_tab * width] = derived.reshape(n_tab, n, width).transpose(1, 0, 2).reshape(n, -1)
        for j, name in enumerate(rt.passthrough):
            out[:, n_tab * width + j] = [_num(r.get(name)) for r in rows]
        return out


def _stack(rt: StreamRuntime, agg: Aggregate) -> tuple[np.ndarray, np.ndarray]:
    """The aggregate's cells as one flat int64 array and where each of ``rt``'s tables starts;
    the aggregate's own array when it holds every table (no copy), else a copy with zeros for
    the tables it lacks (added after its windows)."""
    cells = getattr(agg, "cells", None)
    layout = getattr(agg, "layout", None)
    if cells is not None and layout is not None and cells.dtype == np.int64:
        where: dict[int, tuple[int, int]] = {}
        pos = 0
        for tid, size in layout:
            where[tid] = (pos, size)
            pos += size
        if all(where.get(t.id, (0, -1))[1] == rt.spec.cells for t in rt.tables):
            return cells, np.array([where[t.id][0] for t in rt.tables], dtype=np.int64)
    zeros = np.zeros(rt.spec.cells, np.int64)
    parts = [agg.tables.get(t.id, zeros) for t in rt.tables]
    offsets = np.arange(len(parts), dtype=np.int64) * rt.spec.cells
    flat = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    return flat, offsets


def _per_key_block(
    estimates: np.ndarray, *, prior: np.ndarray, alpha: float, threshold: np.ndarray
) -> np.ndarray:
    """One row per key: the table block of ``column_names`` (counts, total, p, log-odds,
    back-off), from ``derived_columns``."""
    counts, total, p, logodds, backoff = derived_columns(
        estimates, prior=prior, alpha=alpha, threshold=threshold
    )
    return assemble([(counts, total, p, logodds, backoff)], [], estimates.shape[0])


def _num(v: object) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else np.nan


async def featurizer(*, ctx: AppContext, name: str) -> Featurizer:
    store = store_of(ctx)
    served = await store.served(name)
    if served is None:
        raise Unavailable(f"stream {name!r} has no count period yet; retry shortly")
    rt = (await streams.runtime(ctx=ctx, name=name)).counted_at(served)
    cache: dict[str, Featurizer] = ctx.caches.setdefault("featurizer", {})
    hit = cache.get(name)
    if hit is not None and hit.epoch == served and hit.rt is rt:
        return hit
    if hit is not None and hit.epoch == served:
        fz = Featurizer.build(rt, hit.agg, previous=hit)
    else:
        agg = await store.read_agg(name, served)
        if agg is None:
            raise Unavailable(f"aggregate of epoch {served} of {name!r} is missing; retry")
        fz = Featurizer.build(rt, agg)
    cache[name] = fz
    return fz


async def featurize(*, ctx: AppContext, name: str, rows: Sequence[Mapping[str, object]]) -> dict:
    if len(rows) > ctx.settings.max_batch:
        raise PayloadTooLarge(f"rows: {len(rows)} exceeds the limit of {ctx.settings.max_batch}")
    fz = await featurizer(ctx=ctx, name=name)
    check_rows(fz.rt, rows, where="rows", max_string=ctx.settings.max_string_length)
    matrix = fz.transform(rows) if len(rows) < 2000 else await asyncio.to_thread(fz.transform, rows)
    return {"epoch": fz.epoch, "columns": fz.columns, "rows": matrix}


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
    return pa.schema(fields, metadata={"selectivity.epoch": str(fz.epoch)})


async def train_batches(ctx: AppContext, fz: Featurizer) -> AsyncIterator[pa.RecordBatch]:
    """The hot period of the served epoch, window by window up to a snapshot of each window's
    last entry, featurized run by run (never built whole in memory). The rows the counting job
    has counted come by column, as it parsed them (``Keys.cols``: Arrow IPC, one per counted
    run, in order); the rest arrive as chunks of JSON rows (``WindowStore.hot_chunk``), parsed
    here. Each run is featurized into record batches in a worker thread while the next is
    read, up to ``TRAINSET_PARALLEL`` at once (most of the work is numpy, which releases the
    GIL); batches come out in order."""
    windows = store_of(ctx)
    rt = fz.rt
    schema = _schema(fz)
    lo, hi = rt.hot_period(fz.epoch)
    working: deque[asyncio.Future[list[pa.RecordBatch]]] = deque()
    ahead: asyncio.Future[tuple[bytes, int, bytes] | None] | None = None

    def start(job: Callable[..., list[pa.RecordBatch]], *args: object) -> None:
        working.append(asyncio.ensure_future(asyncio.to_thread(job, fz, schema, *args)))

    try:
        for w in range(max(lo, 1), hi + 1):
            runs = await windows.cols_length(rt.name, w)  # before the last entry: runs ≤ it
            last = await windows.hot_last_id(rt.name, w)
            if last is None:
                continue
            covered = b""  # the last entry of the counted runs read
            for i in range(runs):
                blob = await windows.cols_at(rt.name, w, i)
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
                windows.hot_chunk(rt.name, w, begin, last, TRAINSET_CHUNK)
            )
            while True:
                chunk = await ahead
                if chunk is None:
                    break
                last_read, n, rows = chunk
                more = last_read != last and n >= TRAINSET_CHUNK
                if more:  # read the next chunk while this one is featurized
                    ahead = asyncio.ensure_future(
                        windows.hot_chunk(rt.name, w, b"(" + last_read, last, TRAINSET_CHUNK)
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
