"""Rules of ingest (DESIGN §4, §7): accept a batch into the open window, and count accepted
observations into the window's tables.

Accepting is one Lua script per batch (``ingest.lua``): the window must be open, the
Idempotency-Key new; the rows go to the window's hot stream. Counting is the worker's job
(``count_window``, every ``count_seconds``; a roll counts what is left before the window's
tables join the count period): it reads the hot stream from the window's checkpoint, computes
every table's increments summed per cell, and applies them with the move of the checkpoint by
compare-and-set (``count.lua``), so every accepted row is counted exactly once whatever
crashes or races. A batch therefore costs a request one XADD per row, and its increments are
summed with the other batches' before they reach Redis.

This departs from DESIGN §7, where the ingest script itself applies the increments: those were
nine tenths of an ingest request's Redis time (``BENCHMARKS.md``). Nothing else changes: the
hot stream already held every raw row, the tables of a window are read only once it has left
the hot period, and the per-user counters of user-level privacy are kept by the counter (first
``max_contributions_per_window`` observations of a user in arrival order, as before).

Speed: a chunk's increments travel to Redis as one string per table (``pack_ops``), not as two
arguments per cell: redis-py packing hundreds of thousands of small arguments cost more than
the increments."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson
import pyarrow as pa

from service.context import AppContext
from service.core.featurize import Encoded, combine_codes
from service.core.sketch import KeyHasher, SketchSpec, grouped_increments
from service.errors import PayloadTooLarge, Unavailable, ValidationError
from service.features import hotrows
from service.features.validation import check_rows
from service.ingest.schemas import IngestIn, IngestOut
from service.ingest.store import IngestStore
from service.streams import service as streams
from service.streams.runtime import StreamRuntime, TableRef
from service.windows.service import store_of

MAX_WINDOW_RETRIES = 8
COUNT_CHUNK = 20_000  # hot entries counted per compare-and-set
# A table with more increments than its cells / DENSE_RATIO is read, added to and written
# whole (two bulk strings) instead of incremented op by op (BITFIELD costs Redis ~1 µs an op;
# a whole table ~1 ns a cell).
DENSE_RATIO = 64
COUNT_SECONDS_MAX = 30.0  # one counting call stops catching up after this long
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _store(ctx: AppContext) -> IngestStore:
    st = ctx.caches.get("ingest_store")
    if st is None:
        st = ctx.caches["ingest_store"] = IngestStore(ctx.redis, ctx.keys)
    return st


@functools.lru_cache(maxsize=256)
def _hasher(seed: bytes, spec: SketchSpec) -> KeyHasher:
    return KeyHasher(seed=seed, spec=spec)


def batch_rows(body: IngestIn) -> list[bytes]:
    """The batch's raw rows as the hot stream stores them (``hotrows`` reads this shape)."""
    return [
        orjson.dumps(
            {
                "id": o.id,
                "f": o.features,
                "y": o.label,
                "t": o.event_time.isoformat() if o.event_time else None,
            }
        )
        for o in body.observations
    ]


def label_codes(rt: StreamRuntime, labels: pa.Array) -> np.ndarray:
    """Each row's label index (rows hold only labels ingest validated)."""
    dictionary = labels.dictionary_encode()
    index = np.array([rt.label_index[v] for v in dictionary.dictionary.to_pylist()], np.int64)
    codes = dictionary.indices.to_numpy(zero_copy_only=False)
    return index[codes] if index.size else np.empty(0, np.int64)


@dataclass(frozen=True)
class Increments:
    """Increments of a run of observations in each of a window's tables, the prior table
    last: table ``i``'s are ``cells[bounds[i]:bounds[i+1]]`` (cell indices within the table,
    sorted, distinct) and ``deltas[...]`` (summed, nonzero)."""

    cells: np.ndarray
    deltas: np.ndarray
    bounds: np.ndarray

    @property
    def n_tables(self) -> int:
        return len(self.bounds) - 1

    def size(self, i: int) -> int:
        return int(self.bounds[i + 1] - self.bounds[i])

    def packed(self, which: Sequence[int] | None = None) -> list[bytes]:
        """The increments of tables ``which`` (default: all) as ``pack_ops`` strings
        (count.lua's BITFIELD arguments)."""
        if which is None:
            return pack_ops_split(self.cells, self.deltas, self.bounds)
        parts = [np.arange(self.bounds[i], self.bounds[i + 1]) for i in which]
        pick = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum([p.size for p in parts])]).astype(np.int64)
        return pack_ops_split(self.cells[pick], self.deltas[pick], bounds)

    def added_to(self, i: int, table: bytes) -> bytes:
        """Table ``i`` (big-endian int32 cells, as stored) with its increments added, each cell
        saturated to int32 as ``BITFIELD ... OVERFLOW SAT`` saturates."""
        lo, hi = int(self.bounds[i]), int(self.bounds[i + 1])
        cells = np.frombuffer(table, dtype=">i4").astype(np.int64)
        cells[self.cells[lo:hi]] += self.deltas[lo:hi]
        np.clip(cells, INT32_MIN, INT32_MAX, out=cells)
        return cells.astype(">i4").tobytes()


def count_increments(
    rt: StreamRuntime,
    tables: Sequence[TableRef],
    encoded: Mapping[str, Encoded],
    labels: np.ndarray,
) -> Increments:
    """The increments of observations (each feature's codes ``encoded``, label indices
    ``labels``) in each of ``tables``, summed per cell, then the prior table's. Each distinct
    value of a feature is hashed once per table, and the cells of all tables are computed
    together, counting observations per distinct (label, key) pair."""
    spec = rt.spec
    per_table = [combine_codes([encoded[f] for f in t.features]) for t in tables]
    n_tables = len(per_table)
    cells = deltas = np.empty(0, dtype=np.int64)
    if per_table:
        buckets, signs = _hasher(rt.hash_seed, spec).hash_many(
            [(t.name, e.keys) for t, e in zip(tables, per_table, strict=True)]
        )
        # All tables at once, stacked as extra labels: flat index = table * cells + cell.
        n_labels = spec.n_labels
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
    prior = np.bincount(labels, minlength=spec.n_labels)
    nz = np.flatnonzero(prior)
    return Increments(
        cells=np.concatenate([cells - table_of * spec.cells, nz]),
        deltas=np.concatenate([deltas, prior[nz]]),
        bounds=np.append(bounds, bounds[-1] + nz.size),
    )


def tables_of(rt: StreamRuntime, window: int) -> list[TableRef]:
    """The tables window ``window`` has (a selected group is counted from its ``first_epoch``
    on)."""
    return [t for t in rt.tables if t.first_epoch <= window]


def user_ids(rt: StreamRuntime, encoded: Encoded) -> list[str]:
    """The keyed hash (BLAKE2b with the stream's hash seed) of each distinct user-key value
    (``encoded.keys``: canonical bytes): the per-window counters hold these, never a raw
    identifier."""
    return [
        hashlib.blake2b(
            key, key=rt.hash_seed[:64], person=b"selectivity-usr", digest_size=16
        ).hexdigest()
        for key in encoded.keys
    ]


def within_bound(users: np.ndarray, seen: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """Which observations are counted under a bound of ``bound`` per user and window: the
    first ``bound`` of each user's, in arrival order. ``users``: each observation's user code
    (in arrival order); ``seen[u]``: user ``u``'s observations before these. Returns the mask
    of counted observations and every user's ``seen`` after them."""
    order = np.argsort(users, kind="stable")
    sorted_users = users[order]
    first = np.searchsorted(sorted_users, sorted_users)  # each group's start
    rank = np.empty(users.size, dtype=np.int64)
    rank[order] = np.arange(users.size) - first  # earlier observations of the same user
    mask = seen[users] + rank < bound
    return mask, seen + np.bincount(users, minlength=seen.size)


@dataclass(frozen=True)
class Parsed:
    """A run of hot rows, ready to count: each feature's codes, label indices, and with a
    user key each row's user code and the users' keyed hashes."""

    encoded: dict[str, Encoded]
    labels: np.ndarray
    users: np.ndarray | None = None
    user_ids: list[str] = field(default_factory=list)

    def only(self, mask: np.ndarray) -> Parsed:
        return Parsed(
            {f: Encoded(e.codes[mask], e.keys) for f, e in self.encoded.items()},
            self.labels[mask],
        )


def parse_rows(
    rt: StreamRuntime, rows: bytes, *, after: bytes, last: bytes
) -> tuple[Parsed, bytes]:
    """Hot rows (``WindowStore.hot_chunk``: the entries after ``after`` up to ``last``)
    parsed for counting, and the same rows by column as the train set reads them
    (``hotrows.to_ipc``: every feature's codes, the passthrough values, ids, times, labels)."""
    chunk = hotrows.parse_chunk(rows, encode=list(rt.features), passthrough=rt.passthrough)
    blob = hotrows.to_ipc(chunk, after=after, last=last, passthrough=rt.passthrough)
    labels = label_codes(rt, chunk.labels)
    user_key = rt.config.privacy.user_key
    if user_key is None:
        return Parsed(chunk.encoded, labels), blob
    user = chunk.encoded[user_key]
    return Parsed(chunk.encoded, labels, user.codes, user_ids(rt, user)), blob


def _added(inc: Increments, tables: list[int], whole: list[bytes]) -> list[bytes]:
    return [inc.added_to(i, b) for i, b in zip(tables, whole, strict=True)]


async def count_window(*, ctx: AppContext, rt: StreamRuntime, window: int) -> int:
    """Count window ``window``'s hot entries that are not counted yet into its tables, until
    none is left (for at most ``COUNT_SECONDS_MAX`` past the entries there were at the start);
    returns the number of entries counted by this call. Safe to run concurrently and to crash
    anywhere: each run of entries is applied together with the move of the window's
    checkpoint, by compare-and-set (``count.lua``), so every entry is counted exactly once; the
    rows parsed by column go with them (``Keys.cols``: the train set reads those). A window
    leaves the hot period only once it is counted to its end (``windows.roll`` and
    ``windows.expire`` call this first)."""
    store = _store(ctx)
    windows = store_of(ctx)
    last = await windows.hot_last_id(rt.name, window)
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
    expected = await store.counted(rt.name, window)
    while True:
        if expected == last:  # caught up: count what was accepted meanwhile, for a while
            newer = await windows.hot_last_id(rt.name, window)
            if newer is None or newer == last or time.monotonic() > deadline:
                return total
            last = newer
        start = b"(" + expected if expected else "-"
        chunk = await windows.hot_chunk(rt.name, window, start, last, COUNT_CHUNK)
        if chunk is None:
            return total
        checkpoint, n, rows = chunk
        parsed, blob = await asyncio.to_thread(
            parse_rows, rt, rows, after=expected, last=checkpoint
        )
        users = b""
        counted = parsed
        if parsed.users is not None:
            seen = np.array(await store.seen(rt.name, window, parsed.user_ids), dtype=np.int64)
            mask, after = within_bound(parsed.users, seen, bound)
            counted = parsed.only(mask)
            changed = np.flatnonzero(after != seen)
            users = b" ".join(
                b"%s %d" % (parsed.user_ids[u].encode(), after[u]) for u in changed.tolist()
            )
        inc = await asyncio.to_thread(count_increments, rt, tables, counted.encoded, counted.labels)
        # Tables with many increments are written whole (the prior table never is).
        dense = [i for i in range(len(tables)) if inc.size(i) * DENSE_RATIO > rt.spec.cells]
        values: dict[int, bytes] = {}
        if dense:
            current, whole = await store.read_tables(
                stream=rt.name, window=window, table_ids=[table_ids[i] for i in dense]
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
            values = dict(zip(dense, added, strict=True))
        sparse = [i for i in range(inc.n_tables) if i not in values]
        values.update(zip(sparse, inc.packed(sparse), strict=True))
        status, current_ = await store.count(
            stream=rt.name,
            window=window,
            expected=expected,
            checkpoint=checkpoint,
            table_ids=table_ids,
            whole=[i in dense for i in range(inc.n_tables)],
            values=[values[i] for i in range(inc.n_tables)],
            users=users,
            users_ttl=users_ttl,
            columns=blob,
        )
        if status == "missing":
            raise Unavailable(f"window {window} of stream {rt.name!r} has no tables to count into")
        if status == "ok":
            total += n
            expected = checkpoint
        else:  # another counter moved the checkpoint: go on from where it got to
            expected = current_ or b""


async def count_hot(*, ctx: AppContext, rt: StreamRuntime, epoch: int) -> int:
    """Count every window of the hot period of ``epoch`` (the open one included) up to now."""
    lo, hi = rt.hot_period(epoch)
    total = 0
    for w in range(max(lo, 1), hi + 1):
        total += await count_window(ctx=ctx, rt=rt, window=w)
    return total


def pack_ops(cells: np.ndarray, deltas: np.ndarray) -> bytes:
    """Increments for count.lua as one string ``#<cell> <delta> #<cell> <delta> ...``: the
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
    user_key = rt.config.privacy.user_key
    if user_key is not None:
        missing = [i for i, o in enumerate(body.observations) if o.features.get(user_key) is None]
        if missing:
            raise ValidationError(
                f"observations[{missing[0]}].features.{user_key}: the stream's user key is required"
            )


async def ingest(
    *, ctx: AppContext, name: str, body: IngestIn, idempotency_key: str | None
) -> tuple[IngestOut, bool]:
    """Accept a batch into the open window; returns (response, replayed). A batch whose window
    closes under it is accepted into the next window; a retried batch (same Idempotency-Key)
    is never accepted twice while its window is in the hot period. The counting job
    (``count_window``) counts accepted rows into the window's tables."""
    rt = await streams.runtime(ctx=ctx, name=name)
    validate(ctx, rt, body)
    rows = batch_rows(body)
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
        status, stored = await store.accept(
            stream=name,
            window=epoch,
            token=token,
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
        fresh = await windows.epoch(name)  # closed: the stream rolled under us
        if fresh is None or fresh == epoch:
            raise Unavailable(f"stream {name!r} is rolling; retry shortly")
        epoch = fresh
    raise Unavailable(f"stream {name!r} rolled {MAX_WINDOW_RETRIES} times during one batch")
