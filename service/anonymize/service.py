"""k-anonymised releases by SaNGreeA (``service.core.sangreea``) as a job (docs/ARCHITECTURE.md,
"k-anonymised releases").

``create`` checks the request, stores its spec (and inline rows) in Redis and enqueues
``anonymize_run`` keyed by the run's id; ``run`` (the job) reads the rows, clusters them in a
worker thread (BLAS and OpenMP on ``Settings.audit_threads`` threads, as an audit's:
``service.core.threads``) while a throttled writer records the core's progress, and stores the
released table; ``get`` and ``result`` read them back. The algorithm is deterministic, so a run
that crashed (a lost worker: SAQ runs the job again) simply starts over; a run already done is
not redone.

Lifetime. Every key of a run expires ``SELECTIVITY_ANONYMIZATION_TTL_SECONDS`` (default one day)
after its creation; for a stream source at most ``window_seconds`` after it, because the
oldest window of the hot period leaves it at the next roll, at most one window later, and the
release (its ``keep`` columns are raw values, its ranges are bounds of raw values) must not
outlive the rows it is made of. Inline rows are raw data: they are deleted as soon as the run
is done or failed and appear in no log, audit entry or error (errors name columns and counts).

k-anonymity is a syntactic guarantee, not differential privacy: a release is not charged in
the privacy ledger and does not compose with it.
"""

from __future__ import annotations

import asyncio
import io
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from service.anonymize import iml
from service.anonymize.schemas import (
    MAX_INLINE_ROWS,
    AnonymizationCreate,
    AnonymizationOut,
    ClusterView,
    Question,
    WeightsSessionCreate,
    WeightsSessionOut,
)
from service.anonymize.store import AnonymizationStore
from service.context import AppContext
from service.core.hierarchy import parse_hierarchy
from service.core.sangreea import QuasiIdentifier, SangreeaResult, anonymize, normalise_weights
from service.core.threads import blas_limited, openmp_limited
from service.errors import Conflict, NotFound, ServiceError, ValidationError
from service.streams import service as streams

log = logging.getLogger("selectivity.anonymize")

PROGRESS_SECONDS = 0.5  # the least time between two progress writes of a run
HOT_CHUNK = 5000
LABEL = "label"  # a stream source's label column

Format = Literal["csv", "parquet", "arrow", "ndjson"]
MEDIA_TYPES: dict[str, str] = {
    "csv": "text/csv",
    "parquet": "application/vnd.apache.parquet",
    "arrow": "application/vnd.apache.arrow.stream",
    "ndjson": "application/x-ndjson",
}


def _store(ctx: AppContext) -> AnonymizationStore:
    return AnonymizationStore(ctx.redis, ctx.keys)


async def create(*, ctx: AppContext, body: AnonymizationCreate) -> tuple[str, dict[str, Any]]:
    """Store the run and enqueue its job: its id and the spec stored (names, kinds, k,
    weights; no values), which the caller may audit."""
    ttl = ctx.settings.anonymization_ttl_seconds
    names = [q.name for q in body.quasi_identifiers]
    if body.source.stream is not None:
        rt = await streams.runtime(ctx=ctx, name=body.source.stream)  # 404 for an unknown one
        columns = rt.feature_names | {LABEL}
        for where, wanted in (("quasi_identifiers", names), ("keep", body.keep)):
            for name in wanted:
                if name not in columns:
                    raise ValidationError(
                        f"{where}: {name!r} is neither a feature of stream "
                        f"{body.source.stream!r} nor {LABEL!r}"
                    )
        ttl = min(ttl, rt.config.window_seconds)
        source = f"stream:{body.source.stream}"
        rows = None
    else:
        source = "inline"
        rows = orjson.dumps(
            [{c: r[c] for c in [*names, *body.keep]} for r in body.source.rows or []]
        )
    a = f"an_{secrets.token_hex(16)}"
    spec = {
        "source": source,
        "k": body.k,
        "quasi_identifiers": [q.model_dump(mode="json") for q in body.quasi_identifiers],
        "weights": normalise_weights(names, body.weights),
        "keep": body.keep,
    }
    expires_at_ms = int((time.time() + ttl) * 1000)
    await _store(ctx).create(a, spec=spec, data=rows, expires_at_ms=expires_at_ms)
    await ctx.jobs.enqueue("anonymize_run", key=f"anonymize:{a}", timeout=3600, id=a)
    audit = {
        "source": source,
        "rows": len(body.source.rows) if body.source.rows is not None else None,
        "k": body.k,
        "quasi_identifiers": [
            {"name": q.name, "kind": q.kind, "hierarchy": q.hierarchy is not None}
            for q in body.quasi_identifiers
        ],
        "weights": spec["weights"],
        "keep": body.keep,
        "ttl_seconds": ttl,
    }
    return a, audit


async def _meta(ctx: AppContext, a: str) -> dict[str, bytes]:
    meta = await _store(ctx).meta(a)
    if meta is None or "spec" not in meta:
        raise NotFound(f"anonymization {a!r} not found (or expired)")
    return meta


async def get(*, ctx: AppContext, a: str) -> AnonymizationOut:
    meta = await _meta(ctx, a)
    spec = orjson.loads(meta["spec"])
    summary = orjson.loads(meta["summary"]) if "summary" in meta else {}
    return AnonymizationOut(
        id=a,
        status=meta["status"].decode(),  # type: ignore[arg-type]
        progress=float(meta.get("progress", b"0")),
        k=spec["k"],
        source=spec["source"],
        weights=spec["weights"],
        error=meta["error"].decode() if "error" in meta else None,
        **summary,
    )


async def _stream_columns(
    ctx: AppContext, name: str, wanted: Sequence[str], *, limit: int | None = None
) -> tuple[dict[str, list[Any]], int]:
    """The hot period of the stream's open epoch, window by window in entry order: one list
    per wanted column (features by name, ``label``; absent values None); with ``limit``, its
    first ``limit`` rows only."""
    rt = await streams.runtime(ctx=ctx, name=name)
    store = ctx.stores.windows
    epoch = await store.epoch(name)
    columns: dict[str, list[Any]] = {c: [] for c in wanted}
    n = 0
    if epoch is None:
        return columns, 0
    lo, hi = rt.hot_period(epoch)
    for w in range(max(lo, 1), hi + 1):
        start: bytes | str = "-"
        while True:
            chunk = await store.hot_chunk(name, w, start, "+", HOT_CHUNK)
            if chunk is None:
                break
            last, count, rows = chunk
            for rec in orjson.loads(b"[" + rows + b"]"):
                if limit is not None and n >= limit:
                    return columns, n
                feats = rec.get("f") or {}
                for c in wanted:
                    columns[c].append(rec.get("y") if c == LABEL else feats.get(c))
                n += 1
            if n > MAX_INLINE_ROWS:
                raise ValueError(
                    f"source.stream: the hot period has more than {MAX_INLINE_ROWS} rows"
                )
            if count < HOT_CHUNK:
                break
            start = b"(" + last
    return columns, n


def _qis(spec: Mapping[str, Any]) -> list[QuasiIdentifier]:
    out = []
    for q in spec["quasi_identifiers"]:
        tree = q.get("hierarchy")
        h = parse_hierarchy(tree, attribute=f"{q['name']}.hierarchy") if tree else None
        out.append(QuasiIdentifier(q["name"], q["kind"], h))
    return out


def _column(values: list[Any]) -> pa.Array:
    """A kept column as it came: typed when pyarrow can type it, else as JSON text."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array(
            [
                None if v is None else (v if isinstance(v, str) else orjson.dumps(v).decode())
                for v in values
            ],
            pa.string(),
        )


def release_table(
    result: SangreeaResult, columns: Mapping[str, list[Any]], keep: Sequence[str]
) -> pa.Table:
    """One row per input row, in input order: ``cluster``, then the columns in ``columns``'
    order (the QIs as requested, then ``keep``): each QI generalised (ranges as "lo-hi",
    hierarchies as the node's name), the ``keep`` columns unchanged."""
    data: dict[str, pa.Array] = {"cluster": pa.array(result.cluster, pa.int64())}
    for name in [*result.ranges, *result.cats]:
        data[name] = pa.array(result.release_values(name), pa.string())
    for name in keep:
        data[name] = _column(columns[name])
    return pa.table({c: data[c] for c in ["cluster", *columns]})


def _compute(
    columns: dict[str, list[Any]], spec: Mapping[str, Any], progress: list[float], threads: int
) -> tuple[dict[str, Any], bytes]:
    """The release, in a worker thread; the job has limited BLAS to ``threads`` threads, and
    this thread's OpenMP is limited here (``service.core.threads``)."""
    started = time.perf_counter()

    def tick(p: float) -> None:
        progress[0] = p

    with openmp_limited(threads):
        res = anonymize(columns, _qis(spec), int(spec["k"]), spec["weights"], progress=tick)
    table = release_table(res, columns, spec["keep"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    summary = {
        "rows": int(res.cluster.shape[0]),
        "clusters": res.n_clusters,
        "ngil": res.ngil,
        "loss": res.loss,
        "weighted_loss": res.weighted_loss,
        "seconds": round(time.perf_counter() - started, 3),
    }
    return summary, sink.getvalue().to_pybytes()


async def run(*, ctx: AppContext, a: str) -> dict[str, Any]:
    """The job: compute run ``a`` unless it is done, failed or expired."""
    store = _store(ctx)
    meta = await store.meta(a)
    if meta is None or "spec" not in meta:
        return {"status": "expired"}
    if meta["status"] in (b"done", b"failed"):
        return {"status": meta["status"].decode()}
    spec = orjson.loads(meta["spec"])
    expires_at_ms = int(meta["expires_at"])
    await store.set_running(a)
    wanted = [q["name"] for q in spec["quasi_identifiers"]] + list(spec["keep"])
    try:
        if spec["source"] == "inline":
            blob = await store.input(a)
            if blob is None:
                return {"status": "expired"}
            rows = orjson.loads(blob)
            del blob
            columns = {c: [r.get(c) for r in rows] for c in wanted}
            del rows
        else:
            columns, _ = await _stream_columns(ctx, spec["source"].split(":", 1)[1], wanted)
        progress = [0.0]
        threads = ctx.settings.audit_threads
        with blas_limited(threads):  # the process's limit: set from this thread (core.threads)
            work = asyncio.ensure_future(
                asyncio.to_thread(_compute, columns, spec, progress, threads)
            )
            written = 0.0
            while not work.done():
                await asyncio.wait([work], timeout=PROGRESS_SECONDS)
                if progress[0] != written and not work.done():
                    written = progress[0]
                    await store.set_progress(a, written)
            summary, result = work.result()
    except ValueError as exc:  # the core's and the reader's messages name columns, never values
        await store.finish(
            a, expires_at_ms=expires_at_ms, summary=None, result=None, error=str(exc)
        )
        return {"status": "failed"}
    except ServiceError as exc:  # e.g. the stream was deleted since
        await store.finish(
            a, expires_at_ms=expires_at_ms, summary=None, result=None, error=exc.detail
        )
        return {"status": "failed"}
    except Exception as exc:  # not retried: the run is deterministic; its type only, no values
        log.error("anonymization %s failed: %s", a, type(exc).__name__)
        await store.finish(
            a,
            expires_at_ms=expires_at_ms,
            summary=None,
            result=None,
            error=f"internal error ({type(exc).__name__}); see the worker log",
        )
        return {"status": "failed"}
    await store.finish(a, expires_at_ms=expires_at_ms, summary=summary, result=result, error=None)
    return {"status": "done", "rows": summary["rows"], "clusters": summary["clusters"]}


def _encode(table: pa.Table, fmt: Format) -> bytes:
    buf = io.BytesIO()
    if fmt == "csv":
        pacsv.write_csv(table, buf)
    elif fmt == "parquet":
        pq.write_table(table, buf)
    elif fmt == "arrow":
        with pa.ipc.new_stream(buf, table.schema) as writer:
            writer.write_table(table)
    else:
        for row in table.to_pylist():
            buf.write(orjson.dumps(row) + b"\n")
    return buf.getvalue()


async def result(*, ctx: AppContext, a: str, fmt: Format) -> bytes:
    """The released table of a done run in ``fmt``; 409 while it runs or when it failed."""
    meta = await _meta(ctx, a)
    if meta["status"] != b"done":
        raise Conflict(f"anonymization {a!r} is {meta['status'].decode()}, not done")
    blob = await _store(ctx).result(a)
    if blob is None:
        raise NotFound(f"anonymization {a!r} not found (or expired)")
    table = pa.ipc.open_stream(blob).read_all()
    return await asyncio.to_thread(_encode, table, fmt)


# -- iML weights (service.anonymize.iml) ---------------------------------------------------------
IML_SESSION_SECONDS = 3600
"""An iML session (it holds its sample's quasi-identifiers: raw values) lives an hour at most,
and no longer than one window of a stream source (see the module docstring)."""


def _ask(state: dict[str, Any], threads: int) -> tuple[dict[str, Any], WeightsSessionOut]:
    """Cluster the sample with the current weights and pose the next row's question, in a
    worker thread (OpenMP limited here, BLAS by the caller: ``_asked``)."""
    columns = state["columns"]
    names = [q["name"] for q in state["spec"]["quasi_identifiers"]]
    with openmp_limited(threads):
        res = anonymize(columns, _qis(state["spec"]), int(state["spec"]["k"]), state["weights"])
    n = len(res.cluster)
    r = state["answered"] % n
    row = {c: columns[c][r] for c in names}
    d = iml.row_costs(res, row)
    a, b = iml.candidates(res, r, d)
    order = [*res.ranges, *res.cats]
    state["question"] = {
        "row": r,
        "d": [d[a].tolist(), d[b].tolist()],
        "names": order,
    }
    views = [
        ClusterView(size=int(res.size[c]), values={q: res.cluster_values(q)[c] for q in names})
        for c in (a, b)
    ]
    out = WeightsSessionOut(
        session=state["id"],
        answered=state["answered"],
        weights=state["weights"],
        question=Question(row=row, clusters=views),
    )
    return state, out


async def _asked(
    ctx: AppContext, state: dict[str, Any]
) -> tuple[dict[str, Any], WeightsSessionOut]:
    """``_ask`` off the event loop, on the computations' threads (``Settings.audit_threads``)."""
    threads = ctx.settings.audit_threads
    with blas_limited(threads):  # the process's limit: set from the event loop's thread
        return await asyncio.to_thread(_ask, state, threads)


async def start_weights(*, ctx: AppContext, body: WeightsSessionCreate) -> WeightsSessionOut:
    """A new iML session and its first question; 422 when the sample cannot be clustered into
    three clusters of k (a question needs two besides the row's own)."""
    names = [q.name for q in body.quasi_identifiers]
    ttl = IML_SESSION_SECONDS
    if body.source.stream is not None:
        rt = await streams.runtime(ctx=ctx, name=body.source.stream)
        for name in names:
            if name not in rt.feature_names | {LABEL}:
                raise ValidationError(
                    f"quasi_identifiers: {name!r} is neither a feature of stream "
                    f"{body.source.stream!r} nor {LABEL!r}"
                )
        ttl = min(ttl, rt.config.window_seconds)
        try:
            columns, n = await _stream_columns(ctx, body.source.stream, names, limit=body.sample)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
    else:
        rows = (body.source.rows or [])[: body.sample]
        columns = {c: [r[c] for r in rows] for c in names}
        n = len(rows)
    if n < 3 * body.k:
        raise ValidationError(f"sample: {n} rows, fewer than 3·k = {3 * body.k}")
    state: dict[str, Any] = {
        "id": f"iw_{secrets.token_hex(16)}",
        "spec": {
            "k": body.k,
            "quasi_identifiers": [q.model_dump(mode="json") for q in body.quasi_identifiers],
        },
        "columns": columns,
        "weights": normalise_weights(names, body.weights),
        "answered": 0,
        "expires_at": int((time.time() + ttl) * 1000),
    }
    try:
        state, out = await _asked(ctx, state)
    except ValueError as exc:  # the core's messages name columns and counts, never values
        raise ValidationError(str(exc)) from None
    await _store(ctx).save_session(
        state["id"], orjson.dumps(state), expires_at_ms=state["expires_at"]
    )
    return out


async def answer_weights(*, ctx: AppContext, session: str, choice: int) -> WeightsSessionOut:
    """Apply the answer to the current question by ``iml.update`` and pose the next."""
    blob = await _store(ctx).session(session)
    if blob is None:
        raise NotFound(f"weights session {session!r} not found (or expired)")
    state = orjson.loads(blob)
    q = state["question"]
    d = np.asarray(q["d"])
    state["weights"] = iml.update(state["weights"], q["names"], d[choice], d[1 - choice])
    state["answered"] += 1
    state, out = await _asked(ctx, state)
    await _store(ctx).save_session(session, orjson.dumps(state), expires_at_ms=state["expires_at"])
    return out
