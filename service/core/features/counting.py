"""Counting math (pure): the increments a run of hot rows makes in each of a window's tables,
summed per cell; the per-user contribution bound; the wire format of increments for count.lua.
The Redis side is ``service.stores.counting``, the job ``service.counting.service``.

Sensitivity (docs/ARCHITECTURE.md, "Privacy"): one observation adds ±1 to ``depth`` cells of
every table it is counted in and 1 to one prior cell; with a user key, at most
``max_contributions_per_window`` observations of a user are counted per window
(``within_bound``), the first ones in arrival order, so a user changes at most that many times
as many cells (``service.core.dp.budget``)."""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from service.core.features import hotrows
from service.core.features.columns import Encoded, combine_codes, distinct_keys
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.tables import cells as cell_codec
from service.core.tables.sketch import KeyHasher, SketchSpec, grouped_increments

# Digests the counting job keeps per stream (``KeyHasher``'s cache, ~200 B a key, so up to
# ~50 MB for each of the ``HASHER_STREAMS`` streams kept): the same values recur run after run,
# and hashing was a fifth of counting's CPU (BENCHMARKS.md, issue 17). With more streams counted
# in turn the caches are rebuilt each run (slower by the dict inserts, the digests the same).
HASH_CACHE_KEYS = 1 << 18
HASHER_STREAMS = 4
_hashers_lock = threading.Lock()
_hashers: OrderedDict[tuple[bytes, SketchSpec], tuple[int, KeyHasher]] = OrderedDict()


@functools.lru_cache(maxsize=256)
def _plain_hasher(seed: bytes, spec: SketchSpec) -> KeyHasher:
    return KeyHasher(seed=seed, spec=spec)


def hasher(seed: bytes, spec: SketchSpec, *, epoch: int | None = None) -> KeyHasher:
    """The stream's hasher. With ``epoch`` (the counting job's runs in that epoch), one that
    caches digests, keyed by the raw values it hashed: those values are raw data, so the cache
    belongs to one epoch and is replaced by an empty one at the first run of a later epoch, and
    ``forget_keys`` drops it at the first counting tick after a roll even when no row comes.
    A value therefore stays in memory no longer than the hot rows it came from (the window it
    was counted in is hot at least until that roll; docs/ARCHITECTURE.md, "Threat model and
    promises", 1). Without ``epoch``, a hasher that caches nothing."""
    if epoch is None:
        return _plain_hasher(seed, spec)
    with _hashers_lock:
        held = _hashers.get((seed, spec))
        if held is None or held[0] != epoch:
            held = (epoch, KeyHasher(seed=seed, spec=spec, cache_keys=HASH_CACHE_KEYS))
            _hashers[(seed, spec)] = held
        _hashers.move_to_end((seed, spec))
        while len(_hashers) > HASHER_STREAMS:
            _hashers.popitem(last=False)
        return held[1]


def forget_keys(seed: bytes, *, before_epoch: int) -> None:
    """Drop the digest caches of the stream with ``seed`` made in epochs before ``before_epoch``."""
    with _hashers_lock:
        for k in [k for k, (e, _) in _hashers.items() if k[0] == seed and e < before_epoch]:
            del _hashers[k]


def cached_epochs(seed: bytes) -> list[int]:
    """The epochs whose digest caches are held for the stream with ``seed`` (for tests)."""
    with _hashers_lock:
        return [e for k, (e, _) in _hashers.items() if k[0] == seed]


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
        cells = cell_codec.decode(table)
        cells[self.cells[lo:hi]] += self.deltas[lo:hi]
        return cell_codec.encode(cells)


def count_increments(
    rt: StreamRuntime,
    tables: Sequence[TableRef],
    encoded: Mapping[str, Encoded],
    labels: np.ndarray,
    *,
    cache_epoch: int | None = None,
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
        buckets, signs = hasher(rt.hash_seed, spec, epoch=cache_epoch).hash_many(
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
            label_block=n_labels,
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


def parsed_of(rt: StreamRuntime, chunk: hotrows.Chunk) -> Parsed:
    """A chunk of rows ready to count. The user key's codes are made one per distinct key
    (``distinct_keys``): a chunk joined from several (``hotrows.concat``) holds a user's key
    once per piece, and the per-user bound counts by code."""
    labels = label_codes(rt, chunk.labels)
    user_key = rt.config.privacy.user_key
    if user_key is None:
        return Parsed(chunk.encoded, labels)
    user = distinct_keys(chunk.encoded[user_key])
    return Parsed(chunk.encoded, labels, user.codes, user_ids(rt, user))


def parse_rows(
    rt: StreamRuntime, rows: bytes, *, after: bytes, last: bytes
) -> tuple[Parsed, bytes]:
    """Hot rows (``WindowStore.hot_chunk``: the entries after ``after`` up to ``last``)
    parsed for counting, and the same rows by column as the train set reads them
    (``hotrows.to_ipc``: every feature's codes, the passthrough values, ids, times, labels)."""
    chunk = hotrows.parse_chunk(rows, encode=list(rt.features), passthrough=rt.passthrough)
    blob = hotrows.to_ipc(chunk, after=after, last=last, passthrough=rt.passthrough)
    return parsed_of(rt, chunk), blob


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
