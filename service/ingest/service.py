"""Rules of ingest: validate, compute each table's cell increments, apply them with the raw
rows in one Lua call per batch to the open window (DESIGN §7)."""

from __future__ import annotations

import hashlib
import secrets

import numpy as np
import orjson

from service.context import AppContext
from service.core.featurize import row_keys, table_keys
from service.core.sketch import aggregate_increments, hash_keys
from service.errors import PayloadTooLarge, Unavailable, ValidationError
from service.features.validation import check_rows
from service.ingest.schemas import IngestIn, IngestOut
from service.ingest.store import IngestStore
from service.streams import service as streams
from service.streams.runtime import StreamRuntime
from service.windows.service import store_of

MAX_WINDOW_RETRIES = 8


def _store(ctx: AppContext) -> IngestStore:
    st = ctx.caches.get("ingest_store")
    if st is None:
        st = ctx.caches["ingest_store"] = IngestStore(ctx.redis, ctx.keys)
    return st


def batch_ops(
    rt: StreamRuntime, body: IngestIn
) -> tuple[list[int], list[list[bytes]], list[bytes]]:
    """The batch's increments per table (summed per cell), the prior table's last, and the
    raw rows for the hot stream."""
    obs = body.observations
    labels = np.fromiter((rt.label_index[o.label] for o in obs), dtype=np.int64, count=len(obs))
    values = row_keys([o.features for o in obs], rt.features)
    table_ids: list[int] = []
    ops: list[list[bytes]] = []
    for t in rt.tables:
        buckets, signs = hash_keys(
            table_keys(values, t.features), seed=rt.hash_seed, table=t.name, spec=rt.spec
        )
        cells, deltas = aggregate_increments(labels, buckets, signs, rt.spec)
        table_ids.append(t.id)
        ops.append(_pairs(cells, deltas))
    prior = np.bincount(labels, minlength=rt.spec.n_labels)
    nz = np.flatnonzero(prior)
    ops.append(_pairs(nz, prior[nz]))
    rows = [
        orjson.dumps(
            {
                "id": o.id,
                "f": o.features,
                "y": o.label,
                "t": o.event_time.isoformat() if o.event_time else None,
            }
        )
        for o in obs
    ]
    return table_ids, ops, rows


def _pairs(cells: np.ndarray, deltas: np.ndarray) -> list[bytes]:
    out: list[bytes] = []
    for c, d in zip(cells.tolist(), deltas.tolist(), strict=True):
        out.append(b"#%d" % c)
        out.append(b"%d" % d)
    return out


def validate(ctx: AppContext, rt: StreamRuntime, body: IngestIn) -> None:
    limit = ctx.settings.max_batch
    if len(body.observations) > limit:
        raise PayloadTooLarge(
            f"observations: batch of {len(body.observations)} exceeds the limit of {limit}"
        )
    bad = sorted({o.label for o in body.observations if o.label not in rt.label_index})
    if bad:
        raise ValidationError(f"unknown label(s) {bad[:10]}; stream {rt.name!r} has {rt.labels}")
    check_rows(
        rt,
        [o.features for o in body.observations],
        where="observations[].features",
        max_string=ctx.settings.max_string_length,
    )


async def ingest(
    *, ctx: AppContext, name: str, body: IngestIn, idempotency_key: str | None
) -> tuple[IngestOut, bool]:
    """Apply a batch; returns (response, replayed). A batch whose window closes under it is
    applied to the next window; a retried batch (same Idempotency-Key) is never counted twice
    while its window is in the hot period."""
    rt = await streams.runtime(ctx=ctx, name=name)
    validate(ctx, rt, body)
    table_ids, ops, rows = batch_ops(rt, body)
    token = (
        hashlib.sha256(idempotency_key.encode()).hexdigest()
        if idempotency_key
        else "anon-" + secrets.token_hex(16)
    )
    windows = store_of(ctx)
    store = _store(ctx)
    epochs: dict[str, int] = ctx.caches.setdefault("open_epoch", {})
    # The cached open epoch saves a round trip; the script refuses a closed window, and a
    # keyed batch reads the pointer afresh so that its replay check looks at the right windows.
    epoch = (None if idempotency_key else epochs.get(name)) or await windows.epoch(name)
    if epoch is None:
        raise Unavailable(f"stream {name!r} has no open window yet; retry shortly")
    if idempotency_key:
        earlier = list(range(max(1, epoch - rt.config.hot_windows), epoch))
        replay = await store.find_replay(stream=name, windows=earlier, token=token)
        if replay is not None:
            return IngestOut.model_validate_json(replay), True
    ttl = ctx.settings.idempotency_ttl_seconds + rt.config.window_seconds * rt.config.hot_windows
    for _ in range(MAX_WINDOW_RETRIES):
        out = IngestOut(accepted=len(rows), window=epoch)
        status, stored = await store.apply(
            stream=name,
            window=epoch,
            token=token,
            table_ids=table_ids,
            ops=ops,
            rows=rows,
            response=out.model_dump_json().encode(),
            ttl=ttl,
        )
        if status == "ok":
            epochs[name] = epoch
            return out, False
        if status == "dup":
            assert stored is not None
            return IngestOut.model_validate_json(stored), True
        if status == "missing":
            raise Unavailable(f"window {epoch} of stream {name!r} is not prepared; retry shortly")
        fresh = await windows.epoch(name)  # closed: the stream rolled under us
        if fresh is None or fresh == epoch:
            raise Unavailable(f"stream {name!r} is rolling; retry shortly")
        epoch = fresh
    raise Unavailable(f"stream {name!r} rolled {MAX_WINDOW_RETRIES} times during one batch")
