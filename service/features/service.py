"""featurize and getTrainSet over exactly the count period of the served epoch (DESIGN §3, §4).

API processes cache the count-period aggregate in memory, keyed by epoch: one Redis GET of the
``served`` pointer per request, and one read of the aggregate when the epoch moves."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from service.context import AppContext
from service.core.featurize import (
    assemble,
    backoff_threshold,
    column_names,
    derived_columns,
    prior_probabilities,
    row_keys,
    table_keys,
)
from service.core.sketch import estimate, hash_keys
from service.errors import PayloadTooLarge, Unavailable
from service.features.validation import check_rows
from service.streams import service as streams
from service.streams.runtime import StreamRuntime
from service.windows.service import store_of
from service.windows.store import Aggregate

TRAINSET_CHUNK = 5000


@dataclass(frozen=True)
class Featurizer:
    """Everything needed to featurize rows at one epoch, in memory."""

    rt: StreamRuntime
    agg: Aggregate
    columns: list[str]
    prior: np.ndarray
    threshold: float

    @classmethod
    def build(cls, rt: StreamRuntime, agg: Aggregate) -> Featurizer:
        cfg = rt.config
        return cls(
            rt=rt,
            agg=agg,
            columns=column_names([t.name for t in rt.tables], rt.labels, rt.passthrough),
            prior=prior_probabilities(agg.prior),
            threshold=backoff_threshold(
                noise_variance=rt.noise.variance,
                n_windows=agg.n_windows,
                n_labels=len(rt.labels),
                sigmas=cfg.featurize.backoff_sigmas,
            ),
        )

    @property
    def epoch(self) -> int:
        return self.agg.epoch

    def transform(self, rows: Sequence[Mapping[str, object]]) -> np.ndarray:
        rt = self.rt
        values = row_keys(rows, rt.features)
        per_table = []
        zeros = None
        for t in rt.tables:
            cells = self.agg.tables.get(t.id)
            if cells is None:
                zeros = zeros if zeros is not None else np.zeros(rt.spec.cells, np.int64)
                cells = zeros
            buckets, signs = hash_keys(
                table_keys(values, t.features), seed=rt.hash_seed, table=t.name, spec=rt.spec
            )
            est = estimate(cells, buckets, signs, rt.spec)
            per_table.append(
                derived_columns(
                    est, prior=self.prior, alpha=rt.config.featurize.alpha, threshold=self.threshold
                )
            )
        raw = [np.array([_num(r.get(f)) for r in rows], dtype=np.float64) for f in rt.passthrough]
        return assemble(per_table, raw, len(rows))


def _num(v: object) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else np.nan


async def featurizer(*, ctx: AppContext, name: str) -> Featurizer:
    rt = await streams.runtime(ctx=ctx, name=name)
    store = store_of(ctx)
    served = await store.served(name)
    if served is None:
        raise Unavailable(f"stream {name!r} has no count period yet; retry shortly")
    cache: dict[str, Featurizer] = ctx.caches.setdefault("featurizer", {})
    hit = cache.get(name)
    if hit is not None and hit.epoch == served and hit.rt is rt:
        return hit
    if hit is not None and hit.epoch == served:
        fz = Featurizer.build(rt, hit.agg)
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
    """The hot period of the served epoch, read in chunks up to a snapshot of each window's
    last entry, featurized chunk by chunk (never built whole in memory)."""
    store = store_of(ctx)
    rt = fz.rt
    schema = _schema(fz)
    lo, hi = rt.hot_period(fz.epoch)
    for w in range(max(lo, 1), hi + 1):
        last = await store.hot_last_id(rt.name, w)
        if last is None:
            continue
        start: bytes | str = "-"
        while True:
            entries = await store.hot_range(rt.name, w, start, last, TRAINSET_CHUNK)
            if not entries:
                break
            recs = [orjson.loads(fields[b"d"]) for _, fields in entries]
            feats = [r["f"] for r in recs]
            matrix = await asyncio.to_thread(fz.transform, feats)
            arrays = [
                pa.array([r["id"] for r in recs], pa.string()),
                pa.array([r["t"] for r in recs], pa.string()),
                pa.array(np.full(len(recs), w, np.int64)),
                pa.array([r["y"] for r in recs], pa.string()),
            ]
            arrays += [pa.array(matrix[:, j]) for j in range(matrix.shape[1])]
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)
            if entries[-1][0] == last or len(entries) < TRAINSET_CHUNK:
                break
            start = b"(" + entries[-1][0]


async def trainset(*, ctx: AppContext, name: str, fmt: Format) -> tuple[int, AsyncIterator[bytes]]:
    fz = await featurizer(ctx=ctx, name=name)
    schema = _schema(fz)

    async def arrow_like() -> AsyncIterator[bytes]:
        buf = io.BytesIO()
        writer: pa.ipc.RecordBatchStreamWriter | pq.ParquetWriter
        writer = pa.ipc.new_stream(buf, schema) if fmt == "arrow" else pq.ParquetWriter(buf, schema)
        async for batch in train_batches(ctx, fz):
            if fmt == "arrow":
                writer.write_batch(batch)
            else:
                writer.write_table(pa.Table.from_batches([batch]))
            yield _drain(buf)
        writer.close()
        yield _drain(buf)

    async def ndjson() -> AsyncIterator[bytes]:
        names = schema.names
        async for batch in train_batches(ctx, fz):
            cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
            lines = [
                orjson.dumps(dict(zip(names, vals, strict=True)))
                for vals in zip(*cols, strict=True)
            ]
            yield b"\n".join(lines) + b"\n"

    return fz.epoch, (ndjson() if fmt == "ndjson" else arrow_like())


def _drain(buf: io.BytesIO) -> bytes:
    data = buf.getvalue()
    buf.seek(0)
    buf.truncate()
    return data
