"""The ingest and train-set paths timed piece by piece in this process (µs per row), to say
where the HTTP figures' time goes."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from bench import report
from bench.speed.batch import build_aggregate, build_runtime
from bench.speed.load import stored_rows
from service.cli.synthetic import generate, stream_body
from service.core.features import counting, hotrows
from service.features import service as features
from service.ingest.schemas import IngestIn
from service.ingest.service import batch_rows
from service.streams.validation import check_rows


@dataclass
class IngestProfile:
    """One ingest batch of the bench stream, timed piece by piece in this process (µs/row)."""

    ops_per_row: float  # BITFIELD increments per row the counting job applies (summed per cell)
    parse_us: float  # json.loads + the pydantic body model, as FastAPI does
    validate_us: float  # check_rows (the ingest body's validation)
    rows_us: float  # the rows as the hot stream stores them (orjson)
    count_us: float  # counting: parse the stored rows, canonical keys, hashes, summed ops


def ingest_profile(batch: int, repeats: int = 7) -> IngestProfile:
    log = generate(batch, seed=3)
    rt = build_runtime(stream_body("clicks"), secrets.token_bytes(32))
    raw = orjson.dumps({"observations": log.observations(0, batch)})
    body = IngestIn.model_validate(json.loads(raw))
    feats = [o.features for o in body.observations]
    stored = b",".join(batch_rows(body))
    tables = counting.tables_of(rt, 1)

    def count() -> list[bytes]:
        parsed, _ = counting.parse_rows(rt, stored, after=b"", last=b"")
        return counting.count_increments(rt, tables, parsed.encoded, parsed.labels).packed()

    n_ops = sum(len(o.split()) // 2 for o in count())

    def us(fn: Callable[[], object]) -> float:
        return 1e6 * report.median_time(fn, repeats=repeats) / batch

    return IngestProfile(
        ops_per_row=n_ops / batch,
        parse_us=us(lambda: IngestIn.model_validate(json.loads(raw))),
        validate_us=us(lambda: check_rows(rt, feats, where="x", max_string=256)),
        rows_us=us(lambda: batch_rows(body)),
        count_us=us(count),
    )


@dataclass
class TrainsetProfile:
    """One train-set chunk of the bench stream (rows as ingest stores them), timed piece by
    piece in this process (µs/row)."""

    rows: int
    keys_per_row: float  # distinct keys hashed per row, all tables
    counted_us: float  # hotrows.from_ipc: a counted run's columns (what the worker parsed)
    read_us: float  # hotrows.parse_chunk: the chunk's JSON → codes, values, id/label columns
    rows_us: float  # hotrows.parse_rows: the same with orjson row by row (the fallback)
    featurize_us: float  # Featurizer.transform_encoded: hashes, estimates, derived columns
    batch_us: float  # the whole _counted_batches (read, featurize, Arrow arrays)
    json_batch_us: float  # the whole _json_batches (the same from JSON)
    serialize_us: float  # RecordBatch.serialize: the IPC message sent


def trainset_profile(repeats: int = 7) -> TrainsetProfile:
    n = features.TRAINSET_CHUNK
    rt = build_runtime(stream_body("clicks"), secrets.token_bytes(32))
    fz = features.Featurizer.build(rt, build_aggregate(rt, generate(20_000, seed=1)))
    schema = features._schema(fz)
    chunk = b",".join(stored_rows(generate(n, seed=2), 0, n))
    specs = {f.name: f for f in rt.features}
    kw: dict[str, Any] = {
        "encode": [specs[f] for f in fz.encoded_features],
        "passthrough": rt.passthrough,
    }
    parsed = hotrows.parse_chunk(chunk, **kw)
    every = hotrows.parse_chunk(chunk, encode=list(rt.features), passthrough=rt.passthrough)
    blob = hotrows.to_ipc(every, after=b"", last=b"1-0", passthrough=rt.passthrough)
    names = fz.encoded_features
    (batch,) = features._counted_batches(fz, schema, 2, blob)

    def us(fn: Callable[[], object]) -> float:
        return 1e6 * report.median_time(fn, repeats=repeats) / n

    return TrainsetProfile(
        rows=n,
        keys_per_row=sum(len(e.keys) for e in parsed.encoded.values()) / n,
        counted_us=us(lambda: hotrows.from_ipc(blob, encode=names, passthrough=rt.passthrough)),
        read_us=us(lambda: hotrows.parse_chunk(chunk, **kw)),
        rows_us=us(lambda: hotrows.parse_rows(chunk, **kw)),
        featurize_us=us(
            lambda: fz.transform_encoded(parsed.encoded, parsed.raw, n, by_column=True)
        ),
        batch_us=us(lambda: features._counted_batches(fz, schema, 2, blob)),
        json_batch_us=us(lambda: features._json_batches(fz, schema, 2, chunk)),
        serialize_us=us(batch.serialize),
    )
