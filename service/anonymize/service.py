"""k-anonymised releases by SaNGreeA (``service.core.anonymity.sangreea``) as a job
(docs/ARCHITECTURE.md,
"k-anonymised releases").

``create`` checks the request, stores its spec (and inline rows) in Redis and enqueues
``anonymize_run`` keyed by the run's id; ``run`` (the job) reads the rows, clusters them in a
worker thread (BLAS and OpenMP on ``Settings.audit_threads`` threads, as an audit's:
``service.core.threads``) while a throttled writer records the core's progress, and stores the
released table; ``get`` and ``result`` read them back. The algorithm is deterministic, so a run
that crashed (a lost worker: SAQ runs the job again) simply starts over; a run already done is
not redone.

Columns. From a stream source a run or iML session reads only the columns the operator marked
``releasable`` in the stream's configuration (none by default), as quasi-identifiers or kept
columns, and never the stream's user key (``privacy.user_key``, which a configuration cannot
mark releasable): a 422 names the field and the column. Inline rows are the caller's own data,
not the stream's: there any column may be a quasi-identifier or kept.

Owner. A run or session belongs to the key that created it (``spec.owner``, the key id): every
read by another key (status, rows, iML questions and answers), admins' included, is the 404 of
an unknown id. The stream's privacy ledger lists the runs that live, without their rows
(``service.privacy.releases``).

Lifetime. Every key of a run expires ``SELECTIVITY_ANONYMIZATION_TTL_SECONDS`` (default one day)
after its creation, an iML session's after an hour. A stream source reads the hot period of the
epoch open at its creation, windows lo … hi (recorded in the spec, and the run reads exactly
those), and is listed in the stream's index (``AnonymizationStore.index``): ``expire`` deletes
it at the roll that ends window lo's hot period (the roll to lo + H), whose AOF rewrite follows
(``service.lifecycle.expire``), and its keys expire at most ``window_seconds`` after creation
in any case: the release (its ``keep`` columns are raw values, its ranges are bounds of raw
values) does not outlive the rows it is made of. A run or session that sees the hot period
roll past lo while it is created or computed deletes itself. Inline rows are raw data: they
are deleted as soon as the run is done or failed and appear in no log, audit entry or error
(errors name columns and counts).

k-anonymity is a syntactic guarantee, not differential privacy: a release is not charged in
the privacy ledger's ε and does not compose with it; the ledger lists it as non-DP.
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
    max_rows,
)
from service.anonymize.store import AnonymizationStore
from service.context import AppContext
from service.core.anonymity.hierarchy import parse_hierarchy
from service.core.anonymity.sangreea import (
    QuasiIdentifier,
    SangreeaResult,
    anonymize,
    normalise_weights,
)
from service.core.features.runtime import StreamRuntime
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


def check_columns(rt: StreamRuntime, wanted: Mapping[str, Sequence[str]]) -> None:
    """422 unless every column of ``wanted`` (field name -> columns) is one the stream's
    operator marked ``releasable``; the user key never is."""
    cfg = rt.config
    user_key = cfg.privacy.user_key
    for where, names in wanted.items():
        for name in names:
            if name == user_key:
                raise ValidationError(
                    f"{where}: {name!r} is the user key of stream {rt.name!r}; it is never released"
                )
            if name not in rt.feature_names | {LABEL}:
                raise ValidationError(
                    f"{where}: {name!r} is neither a feature of stream {rt.name!r} nor {LABEL!r}"
                )
            if name not in cfg.releasable:
                raise ValidationError(
                    f"{where}: {name!r} is not releasable on stream {rt.name!r} (its "
                    f"configuration's 'releasable' lists {sorted(cfg.releasable)})"
                )


async def _hot_windows(ctx: AppContext, rt: StreamRuntime) -> tuple[int, int]:
    """The windows of the hot period of the stream's open epoch, from window 1 on."""
    epoch = await ctx.stores.windows.epoch(rt.name) or 1
    lo, hi = rt.hot_period(epoch)
    return max(lo, 1), hi


async def _still_hot(ctx: AppContext, rt: StreamRuntime, oldest: int) -> bool:
    """Whether window ``oldest`` is still in the hot period (no roll ended it)."""
    return (await _hot_windows(ctx, rt))[0] <= oldest


def _longest_ms(ctx: AppContext) -> int:
    """The longest a run or session may live: its index key lives that long."""
    return 1000 * max(ctx.settings.anonymization_ttl_seconds, IML_SESSION_SECONDS)


def _inline_rows(rows: Sequence[Mapping[str, Any]], columns: list[str]) -> bytes:
    """The inline rows' used columns as JSON (in a worker thread: up to 100,000 rows)."""
    return orjson.dumps([{c: r[c] for c in columns} for r in rows])


async def create(
    *, ctx: AppContext, body: AnonymizationCreate, owner: str
) -> tuple[str, dict[str, Any]]:
    """Store the run of key ``owner`` and enqueue its job: its id and the spec stored (names,
    kinds, k, weights; no values), which the caller may audit."""
    ttl = ctx.settings.anonymization_ttl_seconds
    names = [q.name for q in body.quasi_identifiers]
    store = _store(ctx)
    a = f"an_{secrets.token_hex(16)}"
    spec: dict[str, Any] = {"owner": owner, "created_at": int(time.time() * 1000)}
    rt = None
    if body.source.stream is not None:
        rt = await streams.runtime(ctx=ctx, name=body.source.stream)  # 404 for an unknown one
        check_columns(rt, {"quasi_identifiers": names, "keep": body.keep})
        ttl = min(ttl, rt.config.window_seconds)
        lo, hi = await _hot_windows(ctx, rt)
        spec |= {"source": f"stream:{rt.name}", "stream_id": rt.id, "windows": [lo, hi]}
        rows = None
        await store.index(rt.name, a, oldest=lo, longest_ms=_longest_ms(ctx))  # before its keys
    else:
        spec["source"] = "inline"
        rows = await asyncio.to_thread(_inline_rows, body.source.rows or [], [*names, *body.keep])
    spec |= {
        "k": body.k,
        "quasi_identifiers": [q.model_dump(mode="json") for q in body.quasi_identifiers],
        "weights": normalise_weights(names, body.weights),
        "keep": body.keep,
    }
    expires_at_ms = spec["created_at"] + ttl * 1000
    await store.create(a, spec=spec, data=rows, expires_at_ms=expires_at_ms)
    if rt is not None and not await _still_hot(ctx, rt, spec["windows"][0]):
        await store.delete(rt.name, [a])  # a roll ended the hot period meanwhile
        raise Conflict(f"source.stream: stream {rt.name!r} rolled meanwhile; retry")
    await ctx.jobs.enqueue("anonymize_run", key=f"anonymize:{a}", owner=owner, timeout=3600, id=a)
    audit = {
        "source": spec["source"],
        "rows": len(body.source.rows) if body.source.rows is not None else None,
        "k": body.k,
        "quasi_identifiers": [
            {"name": q.name, "kind": q.kind, "hierarchy": q.hierarchy is not None}
            for q in body.quasi_identifiers
        ],
        "weights": spec["weights"],
        "keep": body.keep,
        "ttl_seconds": ttl,
        "windows": spec.get("windows"),
    }
    return a, audit


async def _meta(ctx: AppContext, a: str, owner: str) -> dict[str, bytes]:
    """The run's meta when key ``owner`` created it; the same 404 when it did not as when the
    run does not exist."""
    meta = await _store(ctx).meta(a)
    if meta is None or "spec" not in meta or orjson.loads(meta["spec"]).get("owner") != owner:
        raise NotFound(f"anonymization {a!r} not found (or expired)")
    return meta


async def get(*, ctx: AppContext, a: str, owner: str) -> AnonymizationOut:
    meta = await _meta(ctx, a, owner)
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


async def expire(*, ctx: AppContext, rt: StreamRuntime, epoch: int) -> int:
    """Delete the runs and iML sessions of the stream whose oldest window left the hot period
    of ``epoch`` (called by ``service.lifecycle.expire`` at every roll, before its AOF
    rewrite): how many still had keys."""
    store = _store(ctx)
    hot_lo = rt.hot_period(epoch)[0]
    return await store.delete(rt.name, await store.indexed(rt.name, before=hot_lo))


async def of_stream(*, ctx: AppContext, rt: StreamRuntime) -> list[dict[str, Any]]:
    """The runs of the stream that live, for its privacy ledger: id, owner, status, k, the
    column names, the windows read, created and expiry times (ms since the epoch). No rows."""
    store = _store(ctx)
    out = []
    for a in await store.indexed(rt.name):
        if not a.startswith("an_"):
            continue
        meta = await store.meta(a)
        if meta is None or "spec" not in meta:
            continue
        spec = orjson.loads(meta["spec"])
        if spec.get("stream_id") != rt.id:
            continue
        out.append(
            {
                "id": a,
                "owner": spec.get("owner"),
                "status": meta["status"].decode(),
                "k": spec["k"],
                "quasi_identifiers": [q["name"] for q in spec["quasi_identifiers"]],
                "keep": list(spec["keep"]),
                "windows": spec.get("windows"),
                "created_at_ms": spec.get("created_at"),
                "expires_at_ms": int(meta["expires_at"]),
            }
        )
    return out


async def _stream_columns(
    ctx: AppContext,
    name: str,
    wanted: Sequence[str],
    windows: Sequence[int],
    *,
    limit: int | None = None,
    most: int = MAX_INLINE_ROWS,
    parts: int = 1,
) -> tuple[dict[str, list[Any]], int]:
    """Windows ``lo … hi`` (``windows``) of the stream's hot rows, window by window (its
    ``parts`` parts one after the other) in entry order: one list per wanted column (features
    by name, ``label``; absent values None); with ``limit``, its first ``limit`` rows only;
    more than ``most`` is a ValueError."""
    store = ctx.stores.windows
    columns: dict[str, list[Any]] = {c: [] for c in wanted}
    n = 0
    lo, hi = windows
    for w in range(lo, hi + 1):
        async for rows in store.hot_rows(name, w, parts=parts, count=HOT_CHUNK):
            for rec in orjson.loads(b"[" + rows + b"]"):
                if limit is not None and n >= limit:
                    return columns, n
                feats = rec.get("f") or {}
                for c in wanted:
                    columns[c].append(rec.get("y") if c == LABEL else feats.get(c))
                n += 1
            if n > most:
                raise ValueError(
                    f"source.stream: the hot period has more than {most} rows, the most one "
                    "run clusters with its quasi-identifiers (schemas.max_rows)"
                )
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
    if not await store.set_running(a):
        return {"status": "expired"}
    wanted = [q["name"] for q in spec["quasi_identifiers"]] + list(spec["keep"])
    try:
        if spec["source"] != "inline":
            name = spec["source"].split(":", 1)[1]
            rt = await streams.runtime(ctx=ctx, name=name)
            if rt.id != spec.get("stream_id") or "windows" not in spec:
                raise ValueError(f"source.stream: stream {name!r} was deleted since")
            if not await _still_hot(ctx, rt, spec["windows"][0]):  # expire deletes it
                await store.delete(name, [a])
                return {"status": "expired"}
            most = max_rows(len(spec["quasi_identifiers"]))  # the job's size bound
            columns, _ = await _stream_columns(
                ctx, name, wanted, spec["windows"], most=most, parts=rt.parts
            )
        else:
            blob = await store.input(a)
            if blob is None:
                return {"status": "expired"}
            rows = orjson.loads(blob)
            del blob
            columns = {c: [r.get(c) for r in rows] for c in wanted}
            del rows
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
    if not await store.finish(
        a, expires_at_ms=expires_at_ms, summary=summary, result=result, error=None
    ):
        return {"status": "expired"}  # deleted by expire while it computed: nothing written
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


async def result(*, ctx: AppContext, a: str, fmt: Format, owner: str) -> bytes:
    """The released table of a done run of key ``owner`` in ``fmt``; 409 while it runs or
    when it failed."""
    meta = await _meta(ctx, a, owner)
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
and a stream source's no longer than its hot period (see the module docstring)."""


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


async def start_weights(
    *, ctx: AppContext, body: WeightsSessionCreate, owner: str
) -> WeightsSessionOut:
    """A new iML session of key ``owner`` and its first question; 422 when the sample cannot
    be clustered into three clusters of k (a question needs two besides the row's own)."""
    names = [q.name for q in body.quasi_identifiers]
    ttl = IML_SESSION_SECONDS
    s = f"iw_{secrets.token_hex(16)}"
    rt = None
    if body.source.stream is not None:
        rt = await streams.runtime(ctx=ctx, name=body.source.stream)
        check_columns(rt, {"quasi_identifiers": names})
        ttl = min(ttl, rt.config.window_seconds)
        windows = await _hot_windows(ctx, rt)
        try:
            columns, n = await _stream_columns(
                ctx, body.source.stream, names, windows, limit=body.sample, parts=rt.parts
            )
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
    else:
        rows = (body.source.rows or [])[: body.sample]
        columns = {c: [r[c] for r in rows] for c in names}
        n = len(rows)
    if n < 3 * body.k:
        raise ValidationError(f"sample: {n} rows, fewer than 3·k = {3 * body.k}")
    state: dict[str, Any] = {
        "id": s,
        "owner": owner,
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
    store = _store(ctx)
    if rt is not None:  # listed before it is written, so a roll's expire finds it
        await store.index(rt.name, s, oldest=windows[0], longest_ms=_longest_ms(ctx))
    await store.save_session(s, orjson.dumps(state), expires_at_ms=state["expires_at"], new=True)
    if rt is not None and not await _still_hot(ctx, rt, windows[0]):
        await store.delete(rt.name, [s])  # a roll ended the hot period meanwhile
        raise Conflict(f"source.stream: stream {rt.name!r} rolled meanwhile; retry")
    return out


async def answer_weights(
    *, ctx: AppContext, session: str, choice: int, owner: str
) -> WeightsSessionOut:
    """Apply the answer to the current question by ``iml.update`` and pose the next; the
    same 404 for a session of another key as for an unknown one."""
    missing = NotFound(f"weights session {session!r} not found (or expired)")
    blob = await _store(ctx).session(session)
    if blob is None:
        raise missing
    state = orjson.loads(blob)
    if state.get("owner") != owner:
        raise missing
    q = state["question"]
    d = np.asarray(q["d"])
    state["weights"] = iml.update(state["weights"], q["names"], d[choice], d[1 - choice])
    state["answered"] += 1
    state, out = await _asked(ctx, state)
    blob = orjson.dumps(state)
    if not await _store(ctx).save_session(
        session, blob, expires_at_ms=state["expires_at"], new=False
    ):
        raise missing  # deleted meanwhile (its hot period ended)
    return out
