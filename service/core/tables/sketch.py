"""Count-median sketch: hashing, increments, estimates and an in-memory sketch (pure, numpy only).

Each count table of a stream is a *count-median sketch* (called "count sketch" in the
literature): for every label ``y`` it keeps ``depth`` rows of ``width`` signed integer cells.

Source: M. Charikar, K. Chen, M. Farach-Colton, "Finding frequent items in data streams",
ICALP 2002 (Theoretical Computer Science 312(1), 2004).  Pyramid (M. Lécuyer et al., "Pyramid:
Enhancing Selectivity in Big Data Protection with Count Featurization", IEEE S&P 2017) uses these
sketches for its count tables, with every cell initialised with differential-privacy noise; its
released sign hash always returned +1, which silently turns the sketch into a count-min sketch
with a median estimator.  Here the sign hash is a genuine, independent +/-1 hash per row.

Update, for an observation with label index ``y`` and key ``k`` (canonical bytes of the table's
feature values), for every row ``i``::

    C[y][i][h_i(k)] += s_i(k),        h_i(k) in [0, width),  s_i(k) in {+1, -1}

Estimate, over an aggregate ``A`` (int64, typically the sum of several windows' tables)::

    c_hat(y, k) = median_i  s_i(k) * A[y][i][h_i(k)]

Because ``s_i(k)`` is independent of the signs of the colliding keys and of the (zero-mean,
symmetric) noise, every row's term is ``c(y, k)`` plus a symmetric zero-mean error, so the
estimate is unbiased; an unsigned count-min estimate ``min_i A[y][i][h_i(k)]`` is instead biased
low as soon as zero-mean noise dominates the collision mass (the minimum of ``depth`` noise draws
is negative) and biased high when collisions dominate.

Storage layout (Redis, another module): big-endian int32 cells, ``[label][row][bucket]``, i.e.
``flat = label * depth * width + row * width + bucket``; read with ``np.frombuffer(buf, '>i4')``.

Hash construction (stable; changing it invalidates stored tables)::

    digest = BLAKE2b(key=seed, person=b"selectivity-cms", digest_size=4 * depth,
                     message = len(table_utf8).to_bytes(8, "big") || table_utf8 || key)
    word_i = little-endian uint32 of digest[4 i : 4 i + 4]       (i = 0 .. depth - 1)
    h_i(k) = word_i & (width - 1)                                 (low bits)
    s_i(k) = +1 if word_i >> 31 == 0 else -1                      (top bit)

``width <= 2**24`` so the bucket bits (0..23) and the sign bit (31) never overlap; the rows use
disjoint digest bytes, so rows are independent (under the PRF assumption on keyed BLAKE2b).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.core.tables import cells as cell_codec

__all__ = [
    "MAX_DEPTH",
    "MAX_WIDTH",
    "CountMedianSketch",
    "SketchSpec",
    "aggregate_increments",
    "cell_indices",
    "estimate",
    "estimate_count_min",
    "estimate_stacked",
    "grouped_increments",
    "hash_keys",
    "KeyHasher",
]

MAX_WIDTH = 2**24
MAX_DEPTH = 16
_PERSON = b"selectivity-cms"
_MAX_SEED_BYTES = hashlib.blake2b.MAX_KEY_SIZE  # 64


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True)
class SketchSpec:
    """Shape of a count-median sketch: ``n_labels`` x ``depth`` rows x ``width`` buckets.

    ``width`` is a power of two in ``[2, 2**24]`` (buckets are the low bits of a 32-bit hash
    word whose top bit is the sign), ``depth`` is in ``[1, 16]`` (4 digest bytes per row, BLAKE2b
    digests are at most 64 bytes) and ``n_labels >= 1``.
    """

    width: int
    depth: int
    n_labels: int

    def __post_init__(self) -> None:
        width, depth, n_labels = self.width, self.depth, self.n_labels
        if not _is_int(width):
            raise ValueError(f"width must be an int, got {width=!r}")
        if not _is_int(depth):
            raise ValueError(f"depth must be an int, got {depth=!r}")
        if not _is_int(n_labels):
            raise ValueError(f"n_labels must be an int, got {n_labels=!r}")
        width, depth, n_labels = int(width), int(depth), int(n_labels)
        if width < 2 or width & (width - 1):
            raise ValueError(f"width must be a power of two, got {width=}")
        if width > MAX_WIDTH:
            raise ValueError(f"width must be at most 2**24 = {MAX_WIDTH}, got {width=}")
        if not 1 <= depth <= MAX_DEPTH:
            raise ValueError(f"depth must be in [1, {MAX_DEPTH}], got {depth=}")
        if n_labels < 1:
            raise ValueError(f"n_labels must be >= 1, got {n_labels=}")
        # Normalise numpy integers to plain ints (keeps equality/hash/repr simple).
        object.__setattr__(self, "width", width)
        object.__setattr__(self, "depth", depth)
        object.__setattr__(self, "n_labels", n_labels)

    @property
    def cells(self) -> int:
        """Total number of cells, ``n_labels * depth * width``."""
        return self.n_labels * self.depth * self.width

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(n_labels, depth, width)``, the shape of the ``[label][row][bucket]`` layout."""
        return (self.n_labels, self.depth, self.width)


def _check_seed_table(seed: bytes, table: str) -> None:
    if not isinstance(seed, bytes):
        raise ValueError(f"seed must be bytes, got {type(seed).__name__}")
    if not 1 <= len(seed) <= _MAX_SEED_BYTES:
        raise ValueError(f"seed must be 1..{_MAX_SEED_BYTES} bytes long, got {len(seed)} bytes")
    if not isinstance(table, str):
        raise ValueError(f"table must be a str, got {type(table).__name__}")


def hash_keys(
    keys: Sequence[bytes], *, seed: bytes, table: str, spec: SketchSpec
) -> tuple[np.ndarray, np.ndarray]:
    """Hash keys to per-row buckets ``h_i(k)`` and signs ``s_i(k)``.

    Returns ``(buckets, signs)``: ``buckets`` int64 of shape ``(n, depth)`` in ``[0, width)``,
    ``signs`` int8 of shape ``(n, depth)`` in ``{-1, +1}``.

    Keyed BLAKE2b (``hashlib.blake2b(key=seed, person=b"selectivity-cms",
    digest_size=4*depth)``) over ``len(table) (8 bytes, big-endian) || table (utf-8) || key``, so
    different tables of a stream (and different streams' seeds) hash independently.  Row ``i``
    uses digest bytes ``[4i, 4i+4)`` read as a little-endian uint32 ``w``: bucket = ``w & (width
    - 1)`` (low bits), sign = ``+1`` if the top bit of ``w`` is 0 else ``-1``.  Count-sketch
    hashing as in Charikar, Chen & Farach-Colton (2002).

    Each distinct key is hashed once (inputs may be ~1M keys with few distinct values); keys
    must be ``bytes`` (hashable, so that equal keys dedupe).
    """
    _check_seed_table(seed, table)
    depth, mask = spec.depth, spec.width - 1
    n = len(keys)
    if n == 0:
        return np.empty((0, depth), dtype=np.int64), np.empty((0, depth), dtype=np.int8)

    distinct = dict.fromkeys(keys)  # insertion-ordered distinct keys (C speed)
    base = hashlib.blake2b(key=seed, person=_PERSON, digest_size=4 * depth)
    table_bytes = table.encode("utf-8")
    base.update(len(table_bytes).to_bytes(8, "big") + table_bytes)

    digests = bytearray()
    for key in distinct:
        if not isinstance(key, bytes):
            raise ValueError(f"keys must be bytes, got {type(key).__name__}")
        h = base.copy()
        h.update(key)
        digests += h.digest()
    words = np.frombuffer(bytes(digests), dtype="<u4").reshape(len(distinct), depth)
    u_buckets = (words & np.uint32(mask)).astype(np.int64)
    u_signs = (1 - 2 * (words >> np.uint32(31)).astype(np.int8)).astype(np.int8)

    if len(distinct) == n:  # all keys distinct: already in input order
        return u_buckets, u_signs
    position = {key: i for i, key in enumerate(distinct)}
    inverse = np.fromiter(map(position.__getitem__, keys), dtype=np.int64, count=n)
    return u_buckets[inverse], u_signs[inverse]


class KeyHasher:
    """:func:`hash_keys`' construction for many tables of one stream at once.

    Each table's keyed BLAKE2b state (seed as key, the length-prefixed table name absorbed) is
    prepared once and copied per key, and the digests of all tables' keys are turned into
    buckets and signs by one vectorised pass, so hashing a few keys of many tables (one
    featurize row of a 39-feature stream) costs one digest per key and no per-table numpy work.
    The output is exactly :func:`hash_keys`' (a test pins it); keys are not deduplicated here:
    callers pass distinct keys.

    ``cache_keys`` > 0 keeps up to that many digests (all tables together) for the keys hashed
    before, for a hasher that sees the same values call after call (the counting job's runs,
    single-row featurize requests: a dict look-up costs a tenth of a keyed BLAKE2b). Groups of
    more than ``cache_keys / 8`` keys (a big batch) are hashed without it. The cache is dropped
    whole when full (bounded memory, about 200 bytes a key); the digests are the same either
    way.
    """

    def __init__(self, *, seed: bytes, spec: SketchSpec, cache_keys: int = 0) -> None:
        _check_seed_table(seed, "")
        self._seed = seed
        self._spec = spec
        self._bases: dict[str, Any] = {}
        self._cache_keys = cache_keys
        self._digests: dict[str, dict[bytes, bytes]] = {}

    def _base(self, table: str) -> Any:
        base = self._bases.get(table)
        if base is None:
            _check_seed_table(self._seed, table)
            base = hashlib.blake2b(key=self._seed, person=_PERSON, digest_size=4 * self._spec.depth)
            table_bytes = table.encode("utf-8")
            base.update(len(table_bytes).to_bytes(8, "big") + table_bytes)
            self._bases[table] = base
        return base

    def hash_many(
        self, groups: Sequence[tuple[str, Sequence[bytes]]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(buckets, signs)`` of every key of every ``(table, keys)`` group, the groups one
        after another: equal to concatenating ``hash_keys(keys, table=table, ...)``."""
        depth, mask = self._spec.depth, self._spec.width - 1
        digests = bytearray()
        biggest_cached = self._cache_keys // 8
        for table, keys in groups:
            if 0 < len(keys) <= biggest_cached:
                self._cached_digests(table, keys, digests)
                continue
            base = self._base(table)
            for key in keys:
                if not isinstance(key, bytes):
                    raise ValueError(f"keys must be bytes, got {type(key).__name__}")
                h = base.copy()
                h.update(key)
                digests += h.digest()
        words = np.frombuffer(bytes(digests), dtype="<u4").reshape(-1, depth)
        buckets = (words & np.uint32(mask)).astype(np.int64)
        signs = (1 - 2 * (words >> np.uint32(31)).astype(np.int8)).astype(np.int8)
        return buckets, signs

    def _cached_digests(self, table: str, keys: Sequence[bytes], out: bytearray) -> None:
        base = self._base(table)
        held = sum(len(c) for c in self._digests.values())  # exact also across threads
        if held + len(keys) > self._cache_keys:  # full: start again (bounded memory)
            self._digests.clear()
        cache = self._digests.setdefault(table, {})
        get = cache.get
        for key in keys:
            d = get(key)
            if d is None:
                if not isinstance(key, bytes):
                    raise ValueError(f"keys must be bytes, got {type(key).__name__}")
                h = base.copy()
                h.update(key)
                d = cache[key] = h.digest()
            out += d


def _as_int_array(name: str, value: np.ndarray) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an integer array, got dtype {arr.dtype}")
    return arr


def _check_buckets(buckets: np.ndarray, spec: SketchSpec) -> np.ndarray:
    b = _as_int_array("buckets", buckets)
    if b.ndim != 2 or b.shape[1] != spec.depth:
        raise ValueError(f"buckets must have shape (n, depth={spec.depth}), got {b.shape}")
    if b.size and (b.min() < 0 or b.max() >= spec.width):
        raise ValueError(f"buckets must be in [0, width={spec.width})")
    return b


def _check_signs(signs: np.ndarray, spec: SketchSpec, n: int) -> np.ndarray:
    s = _as_int_array("signs", signs)
    if s.shape != (n, spec.depth):
        raise ValueError(f"signs must have shape {(n, spec.depth)}, got {s.shape}")
    if s.size and not np.all((s == 1) | (s == -1)):
        raise ValueError("signs must be in {-1, +1}")
    return s


def cell_indices(labels: np.ndarray, buckets: np.ndarray, spec: SketchSpec) -> np.ndarray:
    """Flat cell indices ``label * depth * width + row * width + bucket``, int64 ``(n, depth)``.

    ``labels``: integer ``(n,)`` in ``[0, n_labels)``; ``buckets``: ``(n, depth)`` from
    :func:`hash_keys`.  Row ``i`` of an observation touches cell ``[labels][i][buckets[:, i]]`` of
    the ``[label][row][bucket]`` layout.
    """
    b = _check_buckets(buckets, spec)
    lab = _as_int_array("labels", labels)
    if lab.ndim != 1 or lab.shape[0] != b.shape[0]:
        raise ValueError(f"labels must have shape ({b.shape[0]},), got {lab.shape}")
    if lab.size and (lab.min() < 0 or lab.max() >= spec.n_labels):
        raise ValueError(f"labels must be in [0, n_labels={spec.n_labels})")
    row_offsets = np.arange(spec.depth, dtype=np.int64) * spec.width
    label_offsets = lab.astype(np.int64) * (spec.depth * spec.width)
    return label_offsets[:, None] + row_offsets[None, :] + b.astype(np.int64)


def aggregate_increments(
    labels: np.ndarray, buckets: np.ndarray, signs: np.ndarray, spec: SketchSpec
) -> tuple[np.ndarray, np.ndarray]:
    """The increments a batch makes, summed per cell.

    Observation ``j`` adds ``signs[j, i]`` to cell ``cell_indices(...)[j, i]`` for every row
    ``i`` (``C[y][i][h_i(k)] += s_i(k)``).  Returns ``(indices, deltas)``: the flat cell indices,
    sorted, unique, int64, and the summed int64 deltas; cells whose increments cancel (delta 0)
    are dropped.  ``cells[indices] += deltas`` applies the batch.
    """
    idx = cell_indices(labels, buckets, spec).ravel()
    sgn = _check_signs(signs, spec, buckets.shape[0]).ravel()
    if idx.size == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    if spec.cells <= 4 * idx.size + 4096:
        # Dense counting: O(n + cells), exact integer arithmetic.
        positive = sgn > 0
        totals = np.bincount(idx[positive], minlength=spec.cells).astype(np.int64)
        totals -= np.bincount(idx[~positive], minlength=spec.cells).astype(np.int64)
        cells = np.flatnonzero(totals).astype(np.int64)
        return cells, totals[cells]
    # Sparse: sort and segment-sum (huge sketches, small batches).
    order = np.argsort(idx, kind="stable")
    sorted_idx = idx[order]
    starts = np.flatnonzero(np.r_[True, sorted_idx[1:] != sorted_idx[:-1]])
    deltas = np.add.reduceat(sgn[order].astype(np.int64), starts)
    keep = deltas != 0
    return sorted_idx[starts][keep].astype(np.int64), deltas[keep]


def grouped_increments(
    labels: np.ndarray,
    codes: np.ndarray,
    buckets: np.ndarray,
    signs: np.ndarray,
    spec: SketchSpec,
    *,
    label_block: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`aggregate_increments` of observations given by key codes: observation ``j`` has
    label ``labels[j]`` and key ``codes[j]``, whose hashes are ``buckets[codes[j]]`` and
    ``signs[codes[j]]`` (one row per distinct key, from :func:`hash_keys`).

    Equal to ``aggregate_increments(labels, buckets[codes], signs[codes], spec)`` (sorted unique
    flat indices, summed nonzero deltas), computed per distinct ``(label, key)`` pair: the
    observations are only counted, and the hashing and cell arithmetic run once per pair.
    Several tables are handled in one call by stacking them as extra labels (a spec with
    ``n_labels = tables * labels`` and label ``t * labels + y``): flat index ``t * cells + i``.
    Stacked callers pass ``label_block = labels`` (every key belongs to one table, so its
    labels lie in one block ``[t * labels, (t + 1) * labels)``; checked): the pairs are then
    counted by one ``bincount`` over ``keys × labels`` instead of a sort of the observations
    (the sort was half of this function's time). Pairs are also counted by ``bincount`` without
    it when ``n_labels × keys`` is small against the observations. The result is the same.
    """
    lab = _as_int_array("labels", labels).astype(np.int64, copy=False)
    code = _as_int_array("codes", codes).astype(np.int64, copy=False)
    b = _check_buckets(buckets, spec)
    s = _check_signs(signs, spec, b.shape[0])
    if lab.shape != code.shape or lab.ndim != 1:
        raise ValueError(
            f"labels and codes must be 1-d of one length, got {lab.shape} and {code.shape}"
        )
    if lab.size == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    n_keys = b.shape[0]
    if code.min() < 0 or code.max() >= n_keys:
        raise ValueError(f"codes must be in [0, {n_keys})")
    if lab.min() < 0 or lab.max() >= spec.n_labels:
        raise ValueError(f"labels must be in [0, n_labels={spec.n_labels})")
    if label_block is not None and label_block > 0:
        # Count the observations of each (key, label within its block) pair: one bincount.
        block, local = np.divmod(lab, label_block)
        key_block = np.zeros(n_keys, dtype=np.int64)
        key_block[code] = block
        if not np.array_equal(key_block[code], block):
            raise ValueError("label_block: a key occurs with labels of two blocks")
        per_pair = np.bincount(code * label_block + local, minlength=n_keys * label_block)
        present = np.flatnonzero(per_pair)
        counts = per_pair[present]
        pair_key, y = np.divmod(present, label_block)
        pair_label = key_block[pair_key] * label_block + y
    elif spec.n_labels * n_keys <= 4 * lab.size + (1 << 16):
        per_pair = np.bincount(lab * n_keys + code, minlength=spec.n_labels * n_keys)
        present = np.flatnonzero(per_pair)
        counts = per_pair[present]
        pair_label, pair_key = np.divmod(present, n_keys)
    else:
        # Count the observations of each (label, key) pair: one sort of n integers.
        pairs = np.sort(lab * n_keys + code)
        starts = np.flatnonzero(np.r_[True, pairs[1:] != pairs[:-1]])
        counts = np.diff(np.r_[starts, pairs.size])
        pair_label, pair_key = np.divmod(pairs[starts], n_keys)
    idx = cell_indices(pair_label, b[pair_key], spec).ravel()
    deltas = (counts[:, None] * s[pair_key].astype(np.int64)).ravel()
    # Sum the pairs that share a cell (collisions): sort (cell, delta) packed in one integer
    # when it fits (np.sort is much faster than a stable argsort), else argsort.
    bound = int(counts.max())
    span = 2 * bound + 1
    if spec.cells * span < 2**62:
        packed = np.sort(idx * span + (deltas + bound))
        idx, deltas = np.divmod(packed, span)
        deltas -= bound
    else:
        order = np.argsort(idx, kind="stable")
        idx, deltas = idx[order], deltas[order]
    first = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
    summed = np.add.reduceat(deltas, first)
    keep = summed != 0
    return idx[first][keep].astype(np.int64, copy=False), summed[keep].astype(np.int64)


def _gather(cells: np.ndarray, buckets: np.ndarray, spec: SketchSpec) -> np.ndarray:
    """``cells[l, i, buckets[j, i]]`` for all j, l, i as int64 of shape ``(n, n_labels, depth)``."""
    c = np.asarray(cells)
    if c.dtype.kind not in "iu":
        raise ValueError(f"cells must be an integer array, got dtype {c.dtype}")
    if c.shape == spec.shape:
        c = c.reshape(-1)
    elif c.shape != (spec.cells,):
        raise ValueError(f"cells must have shape ({spec.cells},) or {spec.shape}, got {c.shape}")
    b = _check_buckets(buckets, spec).astype(np.int64, copy=False)
    label_offsets = np.arange(spec.n_labels, dtype=np.int64) * (spec.depth * spec.width)
    row_offsets = np.arange(spec.depth, dtype=np.int64) * spec.width
    flat = label_offsets[None, :, None] + (row_offsets[None, :] + b)[:, None, :]
    return c.take(flat).astype(np.int64, copy=False)


def estimate(
    cells: np.ndarray, buckets: np.ndarray, signs: np.ndarray, spec: SketchSpec
) -> np.ndarray:
    """Count-median estimate ``c_hat(l, k) = median_i s_i(k) * A[l][i][h_i(k)]`` for every label.

    ``cells``: integer aggregate ``A``, flat (length ``spec.cells``, ``[label][row][bucket]``) or
    of shape ``(n_labels, depth, width)``; ``buckets``/``signs`` from :func:`hash_keys`.  Returns
    float64 ``(n, n_labels)`` (for even ``depth`` the median averages the two middle rows).
    Unbiased under zero-mean symmetric cell noise (Charikar, Chen & Farach-Colton 2002).
    """
    values = _gather(cells, buckets, spec)
    return _signed_median(values, signs, spec)


def _signed_median(values: np.ndarray, signs: np.ndarray, spec: SketchSpec) -> np.ndarray:
    """``median_i s_i * values[:, :, i]`` of gathered cells ``(n, n_labels, depth)``."""
    s = _check_signs(signs, spec, values.shape[0]).astype(np.int64)
    values *= s[:, None, :]
    if values.shape[0] == 0:
        return np.empty((0, spec.n_labels), dtype=np.float64)
    values.sort(axis=2)  # depth <= 16: sorting the short axis beats np.median's partition
    mid = spec.depth // 2
    if spec.depth % 2:
        return values[:, :, mid].astype(np.float64)
    return (values[:, :, mid - 1].astype(np.float64) + values[:, :, mid]) / 2.0


def estimate_stacked(
    cells: np.ndarray,
    offsets: np.ndarray,
    buckets: np.ndarray,
    signs: np.ndarray,
    spec: SketchSpec,
    *,
    checked: bool = True,
) -> np.ndarray:
    """:func:`estimate` for keys of several tables whose aggregates lie one after another in
    one flat integer array: key ``j`` reads the table that starts at ``cells[offsets[j]]``
    (each in the ``[label][row][bucket]`` layout of ``spec``). Equal, key by key, to
    ``estimate(cells[o : o + spec.cells], ...)``, with one gather for all tables.
    ``checked=False`` skips the argument checks, for callers whose arrays come from
    ``KeyHasher`` and a featurizer's own layout (a single-row featurize: the checks cost as
    much as the estimate); indices out of range still raise (``take``).
    """
    if not checked:
        flat = (offsets[:, None, None] + _cell_offsets(spec)) + buckets[:, None, :]
        values = cells.take(flat).astype(np.int64, copy=False)
        values *= signs[:, None, :]
        values.sort(axis=2)
        mid = spec.depth // 2
        if spec.depth % 2:
            return values[:, :, mid].astype(np.float64)
        return (values[:, :, mid - 1].astype(np.float64) + values[:, :, mid]) / 2.0
    c = np.asarray(cells)
    if c.dtype.kind not in "iu" or c.ndim != 1:
        raise ValueError(f"cells must be a flat integer array, got {c.dtype} {c.shape}")
    b = _check_buckets(buckets, spec).astype(np.int64, copy=False)
    off = _as_int_array("offsets", offsets).astype(np.int64, copy=False)
    if off.shape != (b.shape[0],):
        raise ValueError(f"offsets must have shape ({b.shape[0]},), got {off.shape}")
    if off.size and (off.min() < 0 or off.max() + spec.cells > c.size):
        raise ValueError("offsets must address whole tables inside cells")
    flat = (off[:, None, None] + _cell_offsets(spec)) + b[:, None, :]
    values = c.take(flat).astype(np.int64, copy=False)
    return _signed_median(values, signs, spec)


@functools.lru_cache(maxsize=64)
def _cell_offsets(spec: SketchSpec) -> np.ndarray:
    """``label * depth * width + row * width``, shape ``(n_labels, depth)`` (read-only)."""
    label_offsets = np.arange(spec.n_labels, dtype=np.int64) * (spec.depth * spec.width)
    row_offsets = np.arange(spec.depth, dtype=np.int64) * spec.width
    out = label_offsets[:, None] + row_offsets[None, :]
    out.flags.writeable = False
    return out


def estimate_count_min(cells: np.ndarray, buckets: np.ndarray, spec: SketchSpec) -> np.ndarray:
    """Unsigned count-min estimate ``min_i A[l][i][h_i(k)]``, float64 ``(n, n_labels)``.

    For comparison only (tests and benchmarks): the cells must have been updated with ``+1``
    in every row (signs ignored), as in Cormode & Muthukrishnan's count-min sketch (2005).  With
    zero-mean noise in the cells this estimator is biased (low when noise dominates collisions).
    """
    values = _gather(cells, buckets, spec)
    if values.shape[0] == 0:
        return np.empty((0, spec.n_labels), dtype=np.float64)
    return values.min(axis=2).astype(np.float64)


class CountMedianSketch:
    """In-memory count-median sketch (vocabulary of Apache DataSketches).

    ``update`` adds observations, ``merge`` adds another sketch's cells (sketches are linear:
    the merged sketch equals the sketch of the concatenated streams), ``estimate`` returns
    ``median_i s_i(k) * C[l][i][h_i(k)]``, ``to_bytes``/``from_bytes`` use the Redis layout
    (big-endian int32, ``[label][row][bucket]``).  Cells are int64 in memory.
    """

    def __init__(
        self,
        spec: SketchSpec,
        *,
        seed: bytes,
        table: str,
        cells: np.ndarray | None = None,
    ) -> None:
        if not isinstance(spec, SketchSpec):
            raise ValueError(f"spec must be a SketchSpec, got {type(spec).__name__}")
        _check_seed_table(seed, table)
        self._spec = spec
        self._seed = seed
        self._table = table
        if cells is None:
            self._cells = np.zeros(spec.cells, dtype=np.int64)
        else:
            c = np.asarray(cells)
            if c.dtype.kind not in "iu":
                raise ValueError(f"cells must be an integer array, got dtype {c.dtype}")
            if c.shape not in ((spec.cells,), spec.shape):
                raise ValueError(
                    f"cells must have shape ({spec.cells},) or {spec.shape}, got {c.shape}"
                )
            self._cells = c.astype(np.int64).reshape(-1)  # always a copy

    @property
    def spec(self) -> SketchSpec:
        return self._spec

    @property
    def seed(self) -> bytes:
        return self._seed

    @property
    def table(self) -> str:
        return self._table

    @property
    def cells(self) -> np.ndarray:
        """Read-only int64 view of the cells, shape ``(n_labels, depth, width)``."""
        view = self._cells.reshape(self._spec.shape).view()
        view.flags.writeable = False
        return view

    def copy(self) -> CountMedianSketch:
        return CountMedianSketch(self._spec, seed=self._seed, table=self._table, cells=self._cells)

    def update(self, keys: Sequence[bytes], labels: np.ndarray) -> None:
        """For each ``(key, label)``: ``C[label][i][h_i(key)] += s_i(key)`` for every row ``i``."""
        lab = _as_int_array("labels", labels)
        if lab.ndim != 1 or lab.shape[0] != len(keys):
            raise ValueError(f"labels must have shape ({len(keys)},), got {lab.shape}")
        buckets, signs = hash_keys(keys, seed=self._seed, table=self._table, spec=self._spec)
        idx, deltas = aggregate_increments(lab, buckets, signs, self._spec)
        self._cells[idx] += deltas  # idx is unique, so fancy-index += is exact

    def merge(self, other: CountMedianSketch) -> None:
        """Add ``other``'s cells into this sketch (same spec, seed and table required)."""
        if not isinstance(other, CountMedianSketch):
            raise ValueError(f"can only merge a CountMedianSketch, got {type(other).__name__}")
        if other._spec != self._spec:
            raise ValueError(
                f"cannot merge sketches with different specs: {self._spec} != {other._spec}"
            )
        if other._seed != self._seed:
            raise ValueError("cannot merge sketches with different seeds")
        if other._table != self._table:
            raise ValueError(
                f"cannot merge sketches of different tables: {self._table!r} != {other._table!r}"
            )
        self._cells += other._cells

    def estimate(self, keys: Sequence[bytes]) -> np.ndarray:
        """Count-median estimates, float64 ``(n, n_labels)``; see :func:`estimate`."""
        buckets, signs = hash_keys(keys, seed=self._seed, table=self._table, spec=self._spec)
        return estimate(self._cells, buckets, signs, self._spec)

    def to_bytes(self) -> bytes:
        """The stored cell encoding (``service.core.tables.cells``) in ``[label][row][bucket]``
        order.

        Raises ``ValueError`` if a cell does not fit in int32.
        """
        c = self._cells
        if c.size and (c.min() < cell_codec.INT32_MIN or c.max() > cell_codec.INT32_MAX):
            raise ValueError("a cell value does not fit in int32; cannot serialise")
        return cell_codec.encode(c)

    @classmethod
    def from_bytes(
        cls, data: bytes, spec: SketchSpec, *, seed: bytes, table: str
    ) -> CountMedianSketch:
        """Inverse of :meth:`to_bytes` (``spec.cells`` cells)."""
        if len(data) != 4 * spec.cells:
            raise ValueError(
                f"data must be 4 * spec.cells = {4 * spec.cells} bytes, got {len(data)}"
            )
        return cls(spec, seed=seed, table=table, cells=cell_codec.decode(data))

    def __repr__(self) -> str:
        return f"CountMedianSketch({self._spec!r}, table={self._table!r})"
