"""A chunk of hot-stream rows (``WindowStore.hot_chunk``: ``row,row,...``, each row the JSON
ingest stored, ``{"id": ..., "f": {feature: value}, "y": label, "t": event time}``) turned into
what a train-set record batch needs, column by column: each feature's codes (``Encoded``), the
passthrough values, and the ``id``, ``event_time`` and ``label`` columns.

``parse_chunk`` reads the chunk with a handful of numpy passes over its bytes and over the
positions of its quotes and braces, with no Python object per row or value (a train set is ~40
values per row: an object each costs more than everything else). It gives exactly what parsing
every row with ``orjson`` and taking the values apart gives (``parse_rows``, the reference), and
falls back to ``parse_rows`` for a chunk in any other shape than the compact JSON ingest writes:
escapes in a string, a list or object as a value, a string where a number belongs, a missing
``f``. Tests compare the two on random rows."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
from numpy.lib.stride_tricks import sliding_window_view

from service.core.features.columns import (
    MISSING,
    Encoded,
    FeatureSpec,
    canonical_value,
    encode_column,
    encode_numbers,
    passthrough_values,
)


@dataclass(frozen=True)
class Chunk:
    """One chunk of hot rows, by column."""

    n_rows: int
    ids: pa.Array  # string
    times: pa.Array  # string
    labels: pa.Array  # string
    encoded: dict[str, Encoded]  # every feature in ``encode``
    raw: list[np.ndarray]  # float64, one per feature in ``passthrough``


def parse_rows(rows: bytes, *, encode: Sequence[FeatureSpec], passthrough: Sequence[str]) -> Chunk:
    """The chunk parsed row by row with ``orjson``, then taken apart by column: one C-level
    pass per row (``itemgetter`` over the row's features, absent ones null) and one
    ``encode_column`` per feature."""
    recs = orjson.loads(b"[" + rows + b"]")
    names = list(dict.fromkeys([s.name for s in encode] + list(passthrough)))
    columns = feature_columns([r["f"] for r in recs], names)
    by_name = dict(zip(names, columns, strict=True))
    return Chunk(
        n_rows=len(recs),
        ids=pa.array([r["id"] for r in recs], pa.string()),
        times=pa.array([r["t"] for r in recs], pa.string()),
        labels=pa.array([r["y"] for r in recs], pa.string()),
        encoded={s.name: encode_column(by_name[s.name], s) for s in encode},
        raw=[passthrough_values(by_name[f]) for f in passthrough],
    )


def feature_columns(rows: Sequence[dict[str, object]], names: Sequence[str]) -> list[tuple]:
    """The values of ``names`` in every row, one tuple per name (an absent name is None):
    ``row.get(name)`` for every row and name, without a Python-level call per value."""
    if not names:
        return []
    if not rows:
        return [() for _ in names]
    blank = dict.fromkeys(names)
    if len(names) == 1:
        (name,) = names
        return [tuple((blank | r)[name] for r in rows)]
    getter = itemgetter(*names)
    return list(zip(*map(getter, map(blank.__or__, rows)), strict=True))


def parse_chunk(rows: bytes, *, encode: Sequence[FeatureSpec], passthrough: Sequence[str]) -> Chunk:
    """``parse_rows``' result, read column by column with numpy when the chunk is in the shape
    ingest writes (``parse_rows`` itself otherwise)."""
    try:
        return _scan(rows, encode, passthrough)
    except _Unsupported:
        return parse_rows(rows, encode=encode, passthrough=passthrough)


class _Unsupported(Exception):
    """The chunk is not in the shape ``_scan`` reads: ``parse_rows`` reads it."""


_QUOTE, _COLON, _COMMA, _LBRACE, _RBRACE, _LBRACKET, _MINUS, _ZERO = b'":,{}[-0'
_WINDOW = 32  # bytes read from a scalar's start: its end (',' or '}') must lie within them
_SIMPLE_INT = 18  # up to this many digits, an integer is exact in int64 and float64 rounding
# Kinds of value, by their first byte.
_STR, _OBJ, _NUM, _TRUE, _FALSE, _NULL = range(6)
_TOP = (b"id", b"f", b"y", b"t")  # a row's own keys, as ingest writes them
_ID, _F, _Y, _T = range(4)


def _scan(rows: bytes, encode: Sequence[FeatureSpec], passthrough: Sequence[str]) -> Chunk:
    """The chunk as compact JSON (no whitespace, as ``orjson.dumps`` writes it) without a
    backslash, so that every ``"`` opens or closes a string. Every key is a string followed by
    ``:``, its value starts right after; braces outside strings give each key its depth (1: a
    row's own keys, 2: the features in ``f``) and its row. Values are strings (their bytes are
    their canonical form), literals ``true``/``false``/``null``, and numbers (an integer's text
    is its canonical form; other numbers are canonicalised in Python, once per distinct
    text). Anything else raises ``_Unsupported``."""
    size = len(rows)
    if not size or b"\\" in rows:
        raise _Unsupported
    names = list(dict.fromkeys([s.name for s in encode] + list(passthrough)))
    vocab = [name.encode() for name in names]
    pad = max(_WINDOW, 8 * -(-max([len(v) for v in vocab] + [2]) // 8) + 8)
    buf = np.frombuffer(rows + b"}" * pad, dtype=np.uint8)  # padded: windows stay inside
    text = buf[:size]
    quotes = np.flatnonzero(text == _QUOTE)
    if quotes.size % 2:
        raise _Unsupported
    opens, closes = quotes[0::2], quotes[1::2]

    def outside(pos: np.ndarray) -> np.ndarray:  # the positions not inside a string
        return pos[np.searchsorted(quotes, pos) % 2 == 0]

    if b"[" in rows and outside(np.flatnonzero(text == _LBRACKET)).size:
        raise _Unsupported  # a list as a value
    braces = outside(np.flatnonzero((text == _LBRACE) | (text == _RBRACE)))
    step = np.where(buf[braces] == _LBRACE, 1, -1)
    depth = np.cumsum(step)
    if not depth.size or depth.min() < 0 or depth.max() > 2 or depth[-1] != 0:
        raise _Unsupported  # an object as a feature value (depth 3), or not whole rows
    row_starts = braces[(step == 1) & (depth == 1)]
    n = row_starts.size

    # Keys (in order of position), their depth and row, and their values' kinds and bytes:
    # a string's inside, a scalar's text up to the ',' or '}' that ends it.
    key = np.flatnonzero(buf[closes + 1] == _COLON)  # string indices
    key_at = opens[key]
    key_len = closes[key] - key_at - 1
    # Braces (and row starts) before each string: counted over strings, not searched per key.
    after = np.searchsorted(quotes, braces) // 2  # the string each brace precedes
    braces_before = np.cumsum(np.bincount(after, minlength=opens.size + 1))[key]
    top = depth[braces_before - 1] == 1
    starts_after = after[(step == 1) & (depth == 1)]
    key_row = np.cumsum(np.bincount(starts_after, minlength=opens.size + 1))[key] - 1
    v0 = closes[key] + 2
    first = buf[v0]
    kind = np.full(key.size, _NUM, dtype=np.int8)
    for byte, k in ((_QUOTE, _STR), (_LBRACE, _OBJ), (b"t"[0], _TRUE), (b"f"[0], _FALSE)):
        kind[first == byte] = k
    kind[first == b"n"[0]] = _NULL
    start, length = v0.copy(), np.zeros(key.size, dtype=np.int64)
    is_str = np.flatnonzero(kind == _STR)
    nxt = np.minimum(key[is_str] + 1, opens.size - 1)  # the string that is the value
    if not np.array_equal(opens[nxt], v0[is_str]):
        raise _Unsupported
    start[is_str] += 1
    length[is_str] = closes[nxt] - opens[nxt] - 1
    scalar = np.flatnonzero(kind >= _NUM)
    window = sliding_window_view(buf, _WINDOW)[v0[scalar]]
    stop = (window == _COMMA) | (window == _RBRACE)
    if not stop.any(axis=1).all():
        raise _Unsupported  # a number longer than the window
    length[scalar] = stop.argmax(axis=1)
    row_of = np.full(key.size, -1, dtype=np.int64)  # a scalar's row in ``window``
    row_of[scalar] = np.arange(scalar.size)

    # Names: a row's own keys (each once per row; "f" the one object), and the features read
    # (others ignored; each at most once per row).
    words = np.ndarray((buf.size - 7,), dtype="<u8", buffer=buf, strides=(1,))  # at each byte
    known = _Vocabulary.of(tuple(_TOP), tuple(vocab))
    which = known.lookup(words, key_at + 1, key_len)
    name_of = np.where(top, known.first[which], known.second[which])  # -1: neither
    for j in range(len(_TOP)):
        mine = np.flatnonzero(top & (name_of == j))
        if mine.size != n or not np.array_equal(key_row[mine], np.arange(n)):
            raise _Unsupported
    if not np.array_equal(kind == _OBJ, top & (name_of == _F)):
        raise _Unsupported
    pairs = np.flatnonzero(~top & (name_of >= 0))
    pairs = pairs[np.argsort(name_of[pairs].astype(np.int16), kind="stable")]  # radix sort
    bounds = np.searchsorted(name_of[pairs], np.arange(len(names) + 1))
    if (np.diff(name_of[pairs] * (n + 1) + key_row[pairs]) <= 0).any():
        raise _Unsupported

    # Numbers: integers of up to _SIMPLE_INT digits read digit by digit (exact), the others
    # by numpy's parser, correctly rounded like orjson's (a test compares them).
    number = np.flatnonzero(kind == _NUM)
    nlen = length[number]
    widest = int(nlen.max(initial=1))
    win = window[row_of[number], :widest]
    negative = win[:, 0] == _MINUS
    digits = win.astype(np.int64) - _ZERO
    places = np.arange(widest)
    body = (places >= negative[:, None]) & (places < nlen[:, None])
    simple = ~((body & ((digits < 0) | (digits > 9))).any(axis=1))
    simple &= nlen - negative <= _SIMPLE_INT
    value = np.zeros(number.size, dtype=np.int64)
    for c in range(widest):
        value = np.where(body[:, c], value * 10 + digits[:, c], value)
    floats = np.where(negative, -value, value).astype(np.float64)
    other = np.flatnonzero(~simple)
    if other.size:
        texts = win[other].copy()
        texts[places >= nlen[other, None]] = 0
        floats[other] = texts.view(f"S{widest}").reshape(-1).astype(np.float64)
    as_float = np.full(key.size, np.nan)
    as_float[number] = floats
    canonical = np.zeros(key.size, dtype=bool)  # a number whose text is its canonical form
    canonical[number] = simple & ~(negative & (value == 0))  # "-0" is 0

    def column(name: str) -> tuple[np.ndarray, np.ndarray]:
        j = names.index(name)
        at = pairs[bounds[j] : bounds[j + 1]]
        return at, key_row[at]

    values: dict[str, np.ndarray] = {}
    for name in {s.name for s in encode if s.kind == "numeric"} | set(passthrough):
        at, r = column(name)
        if ((kind[at] != _NUM) & (kind[at] != _NULL)).any():
            raise _Unsupported  # e.g. a string or a boolean for a numeric feature
        x = values[name] = np.full(n, np.nan)
        x[r] = as_float[at]  # null: NaN
    encoded = {
        s.name: encode_numbers(values[s.name], np.isnan(values[s.name]), s)
        for s in encode
        if s.kind == "numeric"
    }

    # Categorical: each present value's canonical bytes (in place in the chunk, or appended
    # for a number whose text is not its canonical form), factorised feature by feature.
    extra = bytearray()  # canonical bytes of numbers whose text is not (one per distinct)
    spans: list[tuple[FeatureSpec, np.ndarray, np.ndarray]] = []
    for s in encode:
        if s.kind == "numeric":
            continue
        at, r = column(s.name)
        present = kind[at] != _NULL
        at, r = at[present], r[present]
        odd = at[(kind[at] == _NUM) & ~canonical[at]]
        memo: dict[bytes, tuple[int, int]] = {}
        for p in odd.tolist():
            raw = rows[start[p] : start[p] + length[p]]
            if raw not in memo:
                canon = canonical_value(orjson.loads(raw), s)
                memo[raw] = (buf.size + len(extra), len(canon))
                extra += canon
            start[p], length[p] = memo[raw]
        spans.append((s, at, r))
    if spans:
        source = buf
        if extra:
            source = np.concatenate([buf, np.frombuffer(bytes(extra) + bytes(8), np.uint8)])
        all_codes, all_keys = _factorize(source, start, length, [at for _, at, _ in spans])
        for (s, _, r), codes, keys in zip(spans, all_codes, all_keys, strict=True):
            full = np.full(n, len(keys), dtype=np.int64)
            full[r] = codes
            encoded[s.name] = Encoded(full, keys + [MISSING])

    def strings(j: int) -> pa.Array:
        at = np.flatnonzero(top & (name_of == j))  # one per row, in row order (checked)
        if ((kind[at] != _STR) & (kind[at] != _NULL)).any():
            raise _Unsupported  # parse_rows decides (pa.array(..., pa.string()) refuses)
        valid = kind[at] == _STR
        data, offsets = _gather(buf, start[at], np.where(valid, length[at], 0))
        bitmap = np.packbits(valid, bitorder="little")
        return pa.StringArray.from_buffers(
            n, pa.py_buffer(offsets), pa.py_buffer(data), pa.py_buffer(bitmap)
        )

    return Chunk(
        n_rows=n,
        ids=strings(_ID),
        times=strings(_T),
        labels=strings(_Y),
        encoded={s.name: encoded[s.name] for s in encode},
        raw=[values[f] for f in passthrough],
    )


class _Vocabulary:
    """Two lists of names (a row's own keys; the features read), found in a buffer's strings
    with a few numpy passes: a string is read as 8-byte words zeroed past its length, mixed
    into one 64-bit digest, whose top bits index a table in which the names' digests do not
    collide (a multiplier tried until they do, once per vocabulary; for a vocabulary too large
    for a table of 2^16 slots, a binary search of the sorted digests instead); the candidate
    found is then compared with the string word by word."""

    def __init__(self, first: tuple[bytes, ...], second: tuple[bytes, ...]) -> None:
        names = list(dict.fromkeys(first + second))
        self.n_words = -(-max(len(v) for v in names) // 8)
        table = np.zeros((len(names), 8 * self.n_words), dtype=np.uint8)
        for i, v in enumerate(names):
            table[i, : len(v)] = np.frombuffer(v, np.uint8)
        self.words = table.view("<u8")
        self.sizes = np.array([len(v) for v in names], dtype=np.int64)
        # Index of each name in ``first`` / ``second``, -1 when not there; and for "no name".
        self.first = np.array([first.index(v) if v in first else -1 for v in names] + [-1])
        self.second = np.array([second.index(v) if v in second else -1 for v in names] + [-1])
        digests = self._digest([self.words[:, c] for c in range(self.n_words)], self.sizes)
        self.bits, self.multiplier = 0, np.uint64(1)
        for bits in range(max(4, 2 * len(names).bit_length()), 17):
            for attempt in range(8):
                m = np.uint64((0x9E3779B97F4A7C15 * (2 * attempt + 1)) % (1 << 64) | 1)
                slots = (digests * m) >> np.uint64(64 - bits)
                if np.unique(slots).size == len(names):
                    self.bits, self.multiplier = bits, m
                    break
            if self.bits:
                break
        self.slot = np.full(1 << self.bits, len(names), dtype=np.int64)  # len: no name
        self.slot[((digests * self.multiplier) >> np.uint64(64 - self.bits)).astype(np.int64)] = (
            np.arange(len(names))
        )
        self.order = np.argsort(digests)  # the binary search's, when there is no table
        self.sorted = digests[self.order]
        self.distinct = np.unique(digests).size == len(names)

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def of(first: tuple[bytes, ...], second: tuple[bytes, ...]) -> _Vocabulary:
        return _Vocabulary(first, second)

    @staticmethod
    def _digest(cols: list[np.ndarray], lengths: np.ndarray) -> np.ndarray:
        if len(cols) == 1:
            return cols[0]  # a single word is the string (strings hold no NUL byte)
        h = lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        for col in cols:
            h = (h ^ col) * np.uint64(0xBF58476D1CE4E5B9)
        return h

    def lookup(self, words: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
        """Index of each string (``length`` bytes at ``start``) among the names, or the number
        of names when it is none of them. ``words``: uint64 at every byte offset of the
        buffer, which is padded past the longest name."""
        ok = length <= 8 * self.n_words
        start = np.where(ok, start, 0)
        mine = [
            words[start + 8 * c] & _FILL[np.clip(length - 8 * c, 0, 8)] for c in range(self.n_words)
        ]
        digest = self._digest(mine, length)
        none = len(self.sizes)
        if self.bits:
            found = self.slot[
                ((digest * self.multiplier) >> np.uint64(64 - self.bits)).astype(np.int64)
            ]
        elif self.distinct:
            found = self.order[np.searchsorted(self.sorted, digest).clip(0, none - 1)]
        else:  # two names with one 64-bit digest: never seen, but then read row by row
            raise _Unsupported
        safe = np.minimum(found, none - 1)
        hit = ok & (found < none) & (self.sizes[safe] == length)
        for c in range(self.n_words):
            hit &= self.words[safe, c] == mine[c]
        return np.where(hit, found, none)


_FILL = np.array([(1 << (8 * i)) - 1 for i in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def _factorize(
    buf: np.ndarray, start: np.ndarray, length: np.ndarray, groups: list[np.ndarray]
) -> tuple[list[np.ndarray], list[list[bytes]]]:
    """For each group of strings (``length[i]`` bytes at ``start[i]`` for ``i`` in the
    group): a code per string and the distinct strings by code. A group of strings of up to 8
    bytes is factorised as integers (the bytes, zero-padded: strings hold no NUL byte, so equal
    words are equal strings); any other group through an Arrow binary array."""
    words = np.ndarray((buf.size - 7,), dtype="<u8", buffer=buf, strides=(1,))
    all_codes: list[np.ndarray] = []
    all_keys: list[list[bytes]] = []
    for at in groups:
        lengths = length[at]
        if lengths.size == 0 or lengths.max() <= 8:
            word = words[start[at]] & _FILL[lengths]
            codes, uniques = pd.factorize(word)
            keys = uniques.astype("<u8").view("S8").tolist()  # NUL padding stripped
        else:
            data, offsets = _gather(buf, start[at], lengths)
            binary = pa.BinaryArray.from_buffers(
                pa.binary(),
                at.size,
                [None, pa.py_buffer(offsets), pa.py_buffer(data)],
                null_count=0,
            )
            dictionary = binary.dictionary_encode()
            codes = np.frombuffer(dictionary.indices.buffers()[1], np.int32, count=at.size)
            keys = dictionary.dictionary.to_pylist()
        all_codes.append(np.asarray(codes, dtype=np.int64))
        all_keys.append(keys)
    return all_codes, all_keys


def _gather(
    buf: np.ndarray, start: np.ndarray, length: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The byte ranges ``buf[start[i] : start[i] + length[i]]`` one after another, and their
    int32 offsets (Arrow's binary layout)."""
    offsets = np.zeros(length.size + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    index = np.arange(offsets[-1], dtype=np.int64) + np.repeat(start - offsets[:-1], length)
    return buf[index], offsets.astype(np.int32)


# -- the counted form ---------------------------------------------------------------------
# The counting job parses every hot row once (to count it); it keeps what it parsed, by
# column, next to the hot stream (``Keys.cols``), so that the train set reads counted rows
# without parsing their JSON again: one Arrow IPC stream per counted run of entries, with the
# run's bounds in the schema metadata.


@dataclass(frozen=True)
class Counted:
    """One counted run of a window's hot entries: those after ``after`` (b'' for the first)
    up to ``last``, by column."""

    after: bytes
    last: bytes
    chunk: Chunk


# Each buffer zstd-compressed (Arrow's IPC buffer compression; readers decompress it): a
# counted run takes ~100 B per row of the synthetic click log instead of ~360 (the JSON row is
# ~570), so the hot window costs ~1.2x its JSON in Redis instead of ~1.6x, for ~2 us per row
# when counting and about nothing when the train set reads it (issue 17).
IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


def to_ipc(chunk: Chunk, *, after: bytes, last: bytes, passthrough: Sequence[str]) -> bytes:
    """``chunk`` as one Arrow IPC stream: ids, times, labels, each feature's codes as a
    dictionary array (its keys, canonical bytes, the dictionary), each passthrough column."""
    arrays: list[pa.Array] = [chunk.ids, chunk.times, chunk.labels]
    names = ["id", "t", "y"]
    for name, e in chunk.encoded.items():
        keys = pa.array(e.keys, pa.binary())
        arrays.append(pa.DictionaryArray.from_arrays(pa.array(e.codes, pa.int32()), keys))
        names.append("f:" + name)
    for name, values in zip(passthrough, chunk.raw, strict=True):
        arrays.append(pa.array(values, pa.float64()))
        names.append("r:" + name)
    schema = pa.schema(
        [pa.field(n, a.type) for n, a in zip(names, arrays, strict=True)],
        metadata={"after": after, "last": last},
    )
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=IPC_OPTIONS) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def bounds_of(blob: bytes) -> tuple[bytes, bytes]:
    """``(after, last)`` of a ``to_ipc`` blob, reading only its schema."""
    meta = pa.ipc.open_stream(blob).schema.metadata
    return meta[b"after"], meta[b"last"]


def from_ipc(blob: bytes, *, encode: Sequence[str], passthrough: Sequence[str]) -> Counted:
    """A ``to_ipc`` blob read back: the features ``encode`` and the passthrough columns."""
    reader = pa.ipc.open_stream(blob)
    meta = reader.schema.metadata
    batch = reader.read_next_batch()  # to_ipc writes one
    encoded = {}
    for name in encode:
        col = batch.column("f:" + name)
        codes = col.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        encoded[name] = Encoded(codes, col.dictionary.to_pylist())
    return Counted(
        after=meta[b"after"],
        last=meta[b"last"],
        chunk=Chunk(
            n_rows=batch.num_rows,
            ids=batch.column("id"),
            times=batch.column("t"),
            labels=batch.column("y"),
            encoded=encoded,
            raw=[batch.column("r:" + n).to_numpy(zero_copy_only=False) for n in passthrough],
        ),
    )
