"""Rules of ingest: validate, compute each table's cell increments, apply them with the raw
rows in one Lua call per batch to the open window (DESIGN §7).

Speed: a batch's increments travel to Redis as one string per table (``pack_ops``), not as
two arguments per cell: redis-py packing hundreds of thousands of small arguments was most of
an ingest request's time."""

from __future__ import annotations

import functools
import hashlib
import secrets

import numpy as np
import orjson

from service.context import AppContext
from service.core.featurize import Encoded, combine_codes, encode_column
from service.core.sketch import KeyHasher, SketchSpec, grouped_increments
from service.errors import PayloadTooLarge, Unavailable, ValidationError
from service.features.validation import check_rows
from service.ingest import users
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


@functools.lru_cache(maxsize=256)
def _hasher(seed: bytes, spec: SketchSpec) -> KeyHasher:
    return KeyHasher(seed=seed, spec=spec)


def batch_ops(rt: StreamRuntime, body: IngestIn) -> tuple[list[int], list[bytes], list[bytes]]:
    """The batch's increments per table, summed per cell, and the raw rows for the hot stream.

    ``ops[i]`` holds table ``table_ids[i]``'s increments (``pack_ops``), the prior table's
    last. Each distinct value of a feature is canonicalised and hashed once per table, and the
    cells of all tables are computed together, counting observations per distinct (label, key)
    pair."""
    obs = body.observations
    spec = rt.spec
    labels = np.fromiter((rt.label_index[o.label] for o in obs), dtype=np.int64, count=len(obs))
    feats = [o.features for o in obs]
    specs = {f.name: f for f in rt.features}
    encoded: dict[str, Encoded] = {}
    per_table: list[Encoded] = []
    for t in rt.tables:
        for f in t.features:
            if f not in encoded:
                encoded[f] = encode_column([r.get(f) for r in feats], specs[f])
        per_table.append(combine_codes([encoded[f] for f in t.features]))
    table_ids = [t.id for t in rt.tables]
    ops: list[bytes] = []
    if per_table:
        buckets, signs = _hasher(rt.hash_seed, spec).hash_many(
            [(t.name, e.keys) for t, e in zip(rt.tables, per_table, strict=True)]
        )
        # All tables at once, stacked as extra labels: flat index = table * cells + cell.
        n_tables, n_labels = len(per_table), spec.n_labels
        sizes = [len(e.keys) for e in per_table]
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        stacked = SketchSpec(width=spec.width, depth=spec.depth, n_labels=n_tables * n_labels)
        cells, deltas = grouped_increments(
            np.concatenate([labels + j * n_labels for j in range(n_tables)]),
            np.concatenate([e.codes + starts[j] for j, e in enumerate(per_table)]),
            buckets,
            signs,
            stacked,
        )
        bounds = np.searchsorted(cells, np.arange(n_tables + 1, dtype=np.int64) * spec.cells)
        table_of = np.repeat(np.arange(n_tables, dtype=np.int64), np.diff(bounds))
        ops += pack_ops_split(cells - table_of * spec.cells, deltas, bounds)
    prior = np.bincount(labels, minlength=spec.n_labels)
    nz = np.flatnonzero(prior)
    ops.append(pack_ops(nz, prior[nz]))
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


def pack_ops(cells: np.ndarray, deltas: np.ndarray) -> bytes:
    """Increments for ingest.lua as one string ``#<cell> <delta> #<cell> <delta> ...``: the
    BITFIELD arguments themselves, in decimal. The script splits it with one pattern match per
    op and passes the pieces on as they are (binary pairs would need a number-to-string
    conversion per op in Lua, which costs Redis more than the formatting costs here)."""
    return pack_ops_split(cells, deltas, np.array([0, len(cells)]))[0]


def pack_ops_split(cells: np.ndarray, deltas: np.ndarray, bounds: np.ndarray) -> list[bytes]:
    """``pack_ops`` of the slices ``[bounds[i], bounds[i+1])`` of the ops, formatted in one
    vectorised pass for all of them."""
    cells = np.asarray(cells, dtype=np.int64)
    deltas = np.asarray(deltas, dtype=np.int64)
    bounds = np.asarray(bounds, dtype=np.int64)
    if cells.size == 0:
        return [b""] * (len(bounds) - 1)
    m = cells.size
    cell_chars, cell_used = _decimal(cells)
    delta_chars, delta_used = _decimal(deltas)
    mark = np.full((m, 1), ord("#"), np.uint8)
    space = np.full((m, 1), ord(" "), np.uint8)
    one = np.ones((m, 1), bool)
    chars = np.hstack([mark, cell_chars, space, delta_chars, space])
    used = np.hstack([one, cell_used, one, delta_used, one])
    text = chars[used].tobytes()
    ends = np.cumsum(used.sum(axis=1))  # byte just past each op's trailing space
    starts = np.r_[0, ends]
    return [
        text[starts[lo] : starts[hi] - 1] if hi > lo else b""
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
    ]


def _decimal(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each integer's decimal characters (a '-' before negative ones), right-aligned in one row
    of a uint8 matrix, and the mask of the characters in use."""
    mag = np.abs(values)
    width = len(str(int(mag.max())))
    chars = np.empty((values.size, width + 1), dtype=np.uint8)
    q = mag.copy()
    for col in range(width, 0, -1):
        q, digit = np.divmod(q, 10)
        chars[:, col] = digit
    chars += ord("0")
    pow10 = 10 ** np.arange(1, width, dtype=np.int64)
    n_digits = 1 + (mag[:, None] >= pow10).sum(axis=1)
    negative = np.flatnonzero(values < 0)
    chars[negative, width - n_digits[negative]] = ord("-")  # just before the first digit
    first = width + 1 - n_digits - (values < 0)
    return chars, np.arange(width + 1) >= first[:, None]


def unpack_ops(ops: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of ``pack_ops`` (for tests and tools)."""
    tokens = ops.split()
    cells = np.array([int(t[1:]) for t in tokens[0::2]], dtype=np.int64)
    deltas = np.array([int(t) for t in tokens[1::2]], dtype=np.int64)
    return cells, deltas


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


def _user_store(ctx: AppContext) -> users.UserBoundStore:
    st = ctx.caches.get("user_store")
    if st is None:
        st = ctx.caches["user_store"] = users.UserBoundStore(ctx.redis, ctx.keys)
    return st


def live_tables(
    rt: StreamRuntime, epoch: int, table_ids: list[int], ops: list
) -> tuple[list[int], list]:
    """The tables that exist in window ``epoch`` (a selected group is counted from its
    ``first_epoch`` on) and their ops; the prior table's ops (last) always stay."""
    if all(t.first_epoch <= epoch for t in rt.tables):
        return table_ids, ops
    live = {t.id for t in rt.tables if t.first_epoch <= epoch}
    pairs = [(tid, o) for tid, o in zip(table_ids, ops[:-1], strict=True) if tid in live]
    return [tid for tid, _ in pairs], [o for _, o in pairs] + [ops[-1]]


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
        live_ids, live_ops = live_tables(rt, epoch, table_ids, ops)
        if rt.config.privacy.user_key is None:
            status, stored = await store.apply(
                stream=name,
                window=epoch,
                token=token,
                table_ids=live_ids,
                ops=live_ops,
                rows=rows,
                response=out.model_dump_json().encode(),
                ttl=ttl,
            )
        else:  # at most c counted observations per user per window, decided one by one
            status, stored = await _user_store(ctx).apply(
                stream=name,
                window=epoch,
                token=token,
                table_ids=live_ids,
                per_obs=users.per_observation_ops(rt, body, live_ids),
                n_obs=len(rows),
                max_per_user=rt.config.privacy.max_contributions_per_window,
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
