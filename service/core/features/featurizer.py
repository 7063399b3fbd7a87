"""Featurization at one epoch (pure): the count features of rows from the count-period
aggregate (docs/ARCHITECTURE.md, "Featurization"). Built once per epoch and cached by the API
process (``service.features``)."""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from service.core.features.columns import (
    SEPARATOR,
    Encoded,
    FeatureSpec,
    assemble,
    backoff_threshold,
    canonical_value,
    column_names,
    combine_codes,
    derived_blocks,
    derived_columns,
    encode_column,
    passthrough_values,
    prior_probabilities,
    value_strings,
)
from service.core.features.runtime import StreamRuntime
from service.core.features.shrinkage import MEDIAN_VARIANCE, between_variance
from service.core.tables.aggregate import Aggregate
from service.core.tables.sketch import KeyHasher, estimate_stacked

ROW_BLOCK = 1 << 16  # rows assembled at a time (bounds the temporaries of a big batch)
FEW_ROWS = 8  # up to this many rows, featurize key by key (see Featurizer._transform_few)
# Keys whose derived columns a featurizer keeps for ``_transform_few`` (~150 B a key, all
# tables together), and as many raw values: single-row requests see the same values again
# and again.
FEW_CACHE_KEYS = 1 << 15


@dataclass
class DerivedCache:
    """What ``Featurizer._transform_few`` keeps, per table: ``by_key``, a key's derived columns
    (its block of ``column_names``, float64 bytes); ``by_value``, the same block by the raw value
    of a one-feature table, so that a value seen before costs one dict look-up and no
    canonical form (booleans are never held: True == 1 as a key, but they canonicalise
    differently). Bounded: when the keys pass ``FEW_CACHE_KEYS``, the tables holding the most
    are dropped first (the few-valued tables, hit by nearly every row, stay); a table's values
    are dropped when they pass its share of ``FEW_CACHE_KEYS``."""

    by_key: list[dict[bytes, bytes]]
    by_value: list[dict[object, bytes]]
    held: int = 0  # keys in by_key, all tables (kept as they are added and dropped)

    @classmethod
    def empty(cls, n_tables: int) -> DerivedCache:
        return cls([{} for _ in range(n_tables)], [{} for _ in range(n_tables)])

    @property
    def values_per_table(self) -> int:
        return max(FEW_CACHE_KEYS // max(len(self.by_value), 1), 64)

    def make_room(self, n: int) -> None:
        """Drop the biggest tables' keys (and values) until ``n`` more keys fit."""
        while self.held and self.held + n > FEW_CACHE_KEYS:
            j = max(range(len(self.by_key)), key=lambda t: len(self.by_key[t]))
            self.held -= len(self.by_key[j])
            self.by_key[j].clear()
            self.by_value[j].clear()

    def add(self, j: int, key: bytes, block: bytes) -> None:
        """Keep ``block`` as table ``j``'s derived columns of ``key``."""
        keys = self.by_key[j]
        if key not in keys:
            self.held += 1
        keys[key] = block


@dataclass(frozen=True)
class Featurizer:
    """Everything needed to featurize rows at one epoch, in memory.

    ``transform`` hashes each distinct value of a batch once per table (``KeyHasher``), reads the
    count estimates of those distinct keys for all tables with one gather from the aggregate
    (``estimate_stacked``), derives their columns once, and expands them to the rows with one
    take per block of rows: per-row work is a dict lookup per value and a copy of the output.
    """

    rt: StreamRuntime
    agg: Aggregate
    columns: list[str]
    prior: np.ndarray
    thresholds: np.ndarray  # per table of rt.tables: its noise's back-off threshold
    cells: np.ndarray = field(repr=False, compare=False)  # tables one after another, int64
    offsets: np.ndarray = field(repr=False, compare=False)  # start of each of rt.tables
    hasher: KeyHasher = field(repr=False, compare=False)
    # per table: its features' specs (``_transform_few``), fixed with the runtime
    table_specs: tuple[tuple[FeatureSpec, ...], ...] = field(default=(), repr=False, compare=False)
    # the derived columns of keys and values seen by ``_transform_few``
    derived_cache: DerivedCache | None = field(default=None, repr=False, compare=False)
    # '<f>:value' of the categorical features passed through: strings, after ``columns``
    value_columns: list[str] = field(default_factory=list)
    # featurize.shrinkage "empirical_bayes": per table, σ² of a key's estimate, and τ² per
    # label (tables × labels); None with "pseudo_count"
    sigma2s: np.ndarray | None = field(default=None, repr=False, compare=False)
    tau2s: np.ndarray | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(
        cls, rt: StreamRuntime, agg: Aggregate, *, previous: Featurizer | None = None
    ) -> Featurizer:
        """``previous``: an earlier featurizer of the stream: its stacked cells are reused when
        it has the same aggregate and tables (the runtime is refreshed every few seconds), and
        the derived columns it keeps when they would come out the same."""
        cfg = rt.config
        if (
            previous is not None
            and previous.agg is agg
            and [t.id for t in previous.rt.tables] == [t.id for t in rt.tables]
        ):
            cells, offsets = previous.cells, previous.offsets
        else:
            cells, offsets = _stack(rt, agg)
        table_specs = _table_specs(rt)
        prior = prior_probabilities(agg.prior)
        same_agg = (
            previous is not None
            and previous.agg is agg
            and [t.id for t in previous.rt.tables] == [t.id for t in rt.tables]
        )
        sigma2s, tau2s = _shrinkage(rt, agg, cells, offsets, prior, previous if same_agg else None)
        thresholds = np.array(
            [
                backoff_threshold(
                    noise_variance=rt.noise.variance_for(rt.weight_of(t)),
                    n_windows=agg.n_windows,
                    n_labels=len(rt.labels),
                    sigmas=cfg.featurize.backoff_sigmas,
                )
                for t in rt.tables
            ],
            dtype=np.float64,
        )
        same_columns = (
            previous is not None
            and previous.agg is agg
            and previous.table_specs == table_specs
            and [t.name for t in previous.rt.tables] == [t.name for t in rt.tables]
            and np.array_equal(previous.thresholds, thresholds)
            and previous.rt.config.featurize.alpha == cfg.featurize.alpha
            and previous.rt.config.featurize.shrinkage == cfg.featurize.shrinkage
            and _same(previous.sigma2s, sigma2s)
            and _same(previous.tau2s, tau2s)
        )
        derived_cache = (
            previous.derived_cache
            if previous is not None and same_columns and previous.derived_cache is not None
            else DerivedCache.empty(len(rt.tables))
        )
        return cls(
            rt=rt,
            agg=agg,
            columns=column_names([t.name for t in rt.tables], rt.labels, rt.passthrough),
            prior=prior,
            thresholds=thresholds,
            cells=cells,
            offsets=offsets,
            hasher=KeyHasher(seed=rt.hash_seed, spec=rt.spec),
            table_specs=table_specs,
            derived_cache=derived_cache,
            value_columns=[f"{f}:value" for f in rt.passthrough_categorical],
            sigma2s=sigma2s,
            tau2s=tau2s,
        )

    @property
    def epoch(self) -> int:
        return self.agg.epoch

    def transform(self, rows: Sequence[Mapping[str, object]]) -> np.ndarray:
        """Rows (feature name → value; missing features are null) → ``(n, len(columns))``."""
        if 0 < len(rows) <= FEW_ROWS:
            return self._transform_few(rows)
        rt = self.rt
        names = {f for t in rt.tables for f in t.features} | set(rt.passthrough)
        columns = {name: [r.get(name) for r in rows] for name in names}
        return self.transform_columns(columns, len(rows))

    def transform_columns(self, columns: Mapping[str, Sequence[object]], n_rows: int) -> np.ndarray:
        """The same from columns (feature name → ``n_rows`` values; an absent name is null)."""
        encoded, raw = self.encode_columns(columns, n_rows)
        return self.transform_encoded(encoded, raw, n_rows)

    def encode_columns(
        self, columns: Mapping[str, Sequence[object]], n_rows: int
    ) -> tuple[dict[str, Encoded], list[np.ndarray]]:
        """Codes of every feature a table uses (``encode_column``) and the passthrough values,
        the input of ``transform_encoded``."""
        missing: list[object] = [None] * n_rows

        def column(name: str) -> Sequence[object]:
            col = columns.get(name)
            return missing if col is None else col

        specs = {f.name: f for f in self.rt.features}
        encoded = {f: encode_column(column(f), specs[f]) for f in self.encoded_features}
        return encoded, [passthrough_values(column(f)) for f in self.rt.passthrough]

    @property
    def encoded_features(self) -> list[str]:
        """The features some table reads, in the order of the tables, then the categorical
        features passed through (``value_arrays``, ``values``)."""
        tables = (f for t in self.rt.tables for f in t.features)
        return list(dict.fromkeys([*tables, *self.rt.passthrough_categorical]))

    @property
    def output_columns(self) -> list[str]:
        """Every column of featurize and the train set: ``columns`` (floats), then
        ``value_columns`` (strings)."""
        return self.columns + self.value_columns

    def values(self, rows: Sequence[Mapping[str, object]]) -> list[list[str | None]]:
        """The ``value_columns`` of rows, column by column: each categorical passthrough
        feature's string form (``canonical_value``, as the train set's ``value_arrays``), None
        when missing. Privacy: featurize's caller sent these rows: it gets its own values back
        in canonical form, nothing else (docs/PRIVACY.md, "Raw values as model features")."""
        specs = {f.name: f for f in self.rt.features}
        out: list[list[str | None]] = []
        for name in self.rt.passthrough_categorical:
            e = encode_column([r.get(name) for r in rows], specs[name])
            strings = value_strings(e.keys)
            out.append([strings[c] for c in e.codes.tolist()])
        return out

    def value_arrays(self, encoded: Mapping[str, Encoded]) -> list[pa.StringArray]:
        """The ``value_columns`` from the features' codes (``encode_columns``, the train set's
        parsed chunks): Arrow string arrays, null when missing. Privacy: in the train set these
        are hot rows' raw values, read from the hot window's keys at each download and kept
        nowhere else: the release "hot rows in the train set", raw, for ``model`` keys, as long
        as the hot period (docs/PRIVACY.md, "Raw values as model features"); never the user
        key (refused at stream creation)."""
        return [value_array(encoded[name]) for name in self.rt.passthrough_categorical]

    def transform_encoded(
        self,
        encoded: Mapping[str, Encoded],
        raw: Sequence[np.ndarray],
        n_rows: int,
        *,
        by_column: bool = False,
    ) -> np.ndarray:
        """``transform`` from each feature's codes (``encode_column``; every feature of
        ``encoded_features``) and the passthrough columns' values: ``(n_rows, len(columns))``,
        or with ``by_column`` its transpose ``(len(columns), n_rows)``, C-contiguous (each
        column one flat array, as Arrow takes them)."""
        rt, spec = self.rt, self.rt.spec
        per_table = [combine_codes([encoded[f] for f in t.features]) for t in rt.tables]
        sizes = np.array([len(e.keys) for e in per_table], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        buckets, signs = self.hasher.hash_many(
            [(t.name, e.keys) for t, e in zip(rt.tables, per_table, strict=True)]
        )
        est = estimate_stacked(self.cells, np.repeat(self.offsets, sizes), buckets, signs, spec)
        eb = self.tau2s is not None and self.sigma2s is not None
        derived = _per_key_block(
            est,
            prior=self.prior,
            alpha=rt.config.featurize.alpha,
            threshold=np.repeat(self.thresholds, sizes),
            sigma2=np.repeat(self.sigma2s, sizes) if eb else None,  # type: ignore[arg-type]
            tau2=np.repeat(self.tau2s, sizes, axis=0) if eb else None,  # type: ignore[arg-type]
        )
        n_tab, width = len(rt.tables), derived.shape[1]
        if by_column:
            out_t = _output((n_tab * width + len(raw), n_rows))
            if n_rows and per_table:
                derived_t = np.ascontiguousarray(derived.T)  # (width, keys): rows are columns
                for j, e in enumerate(per_table):
                    block = out_t[j * width : (j + 1) * width]
                    np.take(derived_t, e.codes + starts[j], axis=1, out=block, mode="clip")
            for k, values in enumerate(raw):
                out_t[n_tab * width + k] = values
            return out_t
        out = _output((n_rows, n_tab * width + len(raw)))
        if n_rows and per_table:
            # Block by block: each row's key in every table, then one take of their derived
            # columns, straight into the output when it has no passthrough columns (a 1M-row
            # batch writes ~1 GB: temporaries of that size would double the page faults).
            # A key's block of derived columns is taken as one opaque item (a void view of
            # its bytes): a take over rows of a float matrix costs 2-3x as much.
            item = np.dtype((np.void, width * derived.itemsize))
            blocks = np.ascontiguousarray(derived).reshape(-1).view(item)
            m = min(ROW_BLOCK, n_rows)
            index = np.empty((m, n_tab), dtype=np.int64)
            staging = None if not raw else np.empty(m * n_tab * width, dtype=np.float64)
            for lo in range(0, n_rows, ROW_BLOCK):
                hi = min(lo + ROW_BLOCK, n_rows)
                rows_here = index[: hi - lo]
                for j, e in enumerate(per_table):
                    np.add(e.codes[lo:hi], starts[j], out=rows_here[:, j])
                flat = rows_here.reshape(-1)
                if staging is None:
                    target = out[lo:hi].reshape(-1).view(item)  # a view: out is C-contiguous
                    np.take(blocks, flat, out=target, mode="clip")
                else:
                    part = staging[: flat.size * width]
                    np.take(blocks, flat, out=part.view(item), mode="clip")
                    out[lo:hi, : n_tab * width] = part.reshape(hi - lo, n_tab * width)
        if raw:
            out[:, n_tab * width :] = np.stack(raw, axis=1)
        return out

    def _transform_few(self, rows: Sequence[Mapping[str, object]]) -> np.ndarray:
        """``transform`` of a handful of rows (a featurize request's usual size): the same
        canonical keys, hashes and estimates, without the per-feature encoding arrays, whose
        numpy calls would cost more than the rows. A key's derived columns depend only on the
        featurizer (its aggregate, thresholds and prior), so they are kept (``DerivedCache``):
        a value seen before costs a dict look-up, a key seen before its canonical form and a
        look-up, and only new keys are hashed and estimated, all in one go. The output is
        built from the blocks' bytes and the passthrough values in one piece."""
        rt = self.rt
        n, n_tab = len(rows), len(rt.tables)
        cache = self.derived_cache or DerivedCache.empty(n_tab)
        by_key, by_value = cache.by_key, cache.by_value
        room = cache.values_per_table
        specs = self.table_specs or _table_specs(rt)
        found: list[bytes] = [b""] * (n * n_tab)  # row by row, table by table
        missing: list[tuple[int, int, bytes, object]] = []  # (table, place in found, key, value)
        for i, row in enumerate(rows):
            get = row.get
            at = i * n_tab
            for j, fs in enumerate(specs):
                if len(fs) == 1:
                    raw = value = get(fs[0].name)
                    if raw.__class__ is bool:
                        value = _NOT_HELD
                    else:
                        try:
                            block = by_value[j].get(raw)
                        except TypeError:  # unhashable; validation forbids it
                            value = _NOT_HELD
                        else:
                            if block is not None:
                                found[at + j] = block
                                continue
                    key = canonical_value(raw, fs[0])
                else:
                    value = _NOT_HELD
                    key = SEPARATOR.join(canonical_value(get(f.name), f) for f in fs)
                block = by_key[j].get(key)
                if block is None:
                    missing.append((j, at + j, key, value))
                    continue
                found[at + j] = block
                if value is not _NOT_HELD:
                    _hold(by_value[j], value, block, room)
        if missing:
            self._derive_missing(missing, cache, found)
        parts = found
        if rt.passthrough:
            packer = struct.Struct(f"{len(rt.passthrough)}d")  # native float64, as numpy's
            parts = []
            for i, row in enumerate(rows):
                get = row.get
                parts += found[i * n_tab : (i + 1) * n_tab]
                parts.append(packer.pack(*[_num(get(name)) for name in rt.passthrough]))
        out = np.frombuffer(bytearray(b"".join(parts)), dtype=np.float64)
        return out.reshape(n, len(self.columns))

    def _derive_missing(
        self,
        missing: list[tuple[int, int, bytes, object]],
        cache: DerivedCache,
        found: list[bytes],
    ) -> None:
        """The derived columns of keys not kept yet: hashed and estimated together (one
        gather), derived in Python floats (``derived_blocks``: fewer numpy calls), then kept."""
        rt = self.rt
        tables = rt.tables
        buckets, signs = self.hasher.hash_many([(tables[m[0]].name, [m[2]]) for m in missing])
        offsets = np.array([self.offset_list[m[0]] for m in missing], dtype=np.int64)
        est = estimate_stacked(self.cells, offsets, buckets, signs, rt.spec, checked=False)
        if self.tau2s is not None and self.sigma2s is not None:  # empirical Bayes: numpy
            which = np.array([m[0] for m in missing], dtype=np.int64)
            derived = _per_key_block(
                est,
                prior=self.prior,
                alpha=rt.config.featurize.alpha,
                threshold=self.thresholds[which],
                sigma2=self.sigma2s[which],
                tau2=self.tau2s[which],
            )
            blocks = [row.tobytes() for row in np.ascontiguousarray(derived)]
        else:
            blocks = derived_blocks(
                est.tolist(),
                prior=self.prior_list,
                alpha=rt.config.featurize.alpha,
                thresholds=[self.threshold_list[m[0]] for m in missing],
            )
        cache.make_room(len(missing))
        room = cache.values_per_table
        for (j, place, key, value), block in zip(missing, blocks, strict=True):
            found[place] = block
            cache.add(j, key, block)
            if value is not _NOT_HELD:
                _hold(cache.by_value[j], value, block, room)

    @functools.cached_property
    def offset_list(self) -> list[int]:
        return self.offsets.tolist()  # type: ignore[no-any-return]

    @functools.cached_property
    def threshold_list(self) -> list[float]:
        return self.thresholds.tolist()  # type: ignore[no-any-return]

    @functools.cached_property
    def prior_list(self) -> list[float]:
        return self.prior.tolist()  # type: ignore[no-any-return]


_NOT_HELD = object()  # a value ``DerivedCache.by_value`` does not hold (bool, unhashable, pair)


def _hold(values: dict[object, bytes], value: object, block: bytes, room: int) -> None:
    if len(values) >= room:
        values.clear()
    values[value] = block


# From this size on, outputs are allocated without numpy's transparent-huge-page hint.
PLAIN_PAGES_FROM = 1 << 24


def _output(shape: tuple[int, int]) -> np.ndarray:
    """An output matrix (float64, C-contiguous, writable). A big one (a 300,000-row batch
    writes 374 MB) comes from ``calloc`` (a bytearray: fresh zero pages, not written twice)
    rather than ``np.empty``, which asks the kernel for huge pages: with the common
    ``transparent_hugepage/defrag = madvise``, faulting those in on fragmented memory stalls in
    direct compaction, which made the same batch 1.5-2x slower after another job had run
    (measured here: 2.0-2.45 s against 1.25-1.7 s)."""
    size = shape[0] * shape[1]
    if size * 8 < PLAIN_PAGES_FROM:
        return np.empty(shape, dtype=np.float64)
    return np.frombuffer(bytearray(size * 8), dtype=np.float64).reshape(shape)


def _table_specs(rt: StreamRuntime) -> tuple[tuple[FeatureSpec, ...], ...]:
    specs = {f.name: f for f in rt.features}
    return tuple(tuple(specs[name] for name in t.features) for t in rt.tables)


def _stack(rt: StreamRuntime, agg: Aggregate) -> tuple[np.ndarray, np.ndarray]:
    """The aggregate's cells as one flat int64 array and where each of ``rt``'s tables starts;
    the aggregate's own array when it holds every table (no copy), else a copy with zeros for
    the tables it lacks (added after its windows)."""
    cells = getattr(agg, "cells", None)
    layout = getattr(agg, "layout", None)
    if cells is not None and layout is not None and cells.dtype == np.int64:
        where: dict[int, tuple[int, int]] = {}
        pos = 0
        for tid, size in layout:
            where[tid] = (pos, size)
            pos += size
        if all(where.get(t.id, (0, -1))[1] == rt.spec.cells for t in rt.tables):
            return cells, np.array([where[t.id][0] for t in rt.tables], dtype=np.int64)
    zeros = np.zeros(rt.spec.cells, np.int64)
    parts = [agg.tables.get(t.id, zeros) for t in rt.tables]
    offsets = np.arange(len(parts), dtype=np.int64) * rt.spec.cells
    flat = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    return flat, offsets


def _per_key_block(
    estimates: np.ndarray,
    *,
    prior: np.ndarray,
    alpha: float,
    threshold: np.ndarray,
    sigma2: np.ndarray | None = None,
    tau2: np.ndarray | None = None,
) -> np.ndarray:
    """One row per key: the table block of ``column_names`` (counts, total, p, log-odds,
    back-off), from ``derived_columns`` (empirical Bayes with ``tau2``)."""
    counts, total, p, logodds, backoff = derived_columns(
        estimates, prior=prior, alpha=alpha, threshold=threshold, sigma2=sigma2, tau2=tau2
    )
    return assemble([(counts, total, p, logodds, backoff)], [], estimates.shape[0])


def _num(v: object) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else np.nan


def value_array(e: Encoded) -> pa.StringArray:
    """A categorical passthrough column from its codes: the values' strings
    (``value_strings``, each distinct one decoded once and taken by code in Arrow), null where
    the value is missing. A plain string column, not a dictionary one: the train set's Arrow
    stream is written message by message, with no dictionary batches."""
    strings = value_strings(e.keys)
    codes = e.codes
    mask = None
    if None in strings:
        gone = strings.index(None)
        mask = codes == gone
        codes = np.where(mask, 0, codes)
    indices = pa.array(codes.astype(np.int32, copy=False), pa.int32(), mask=mask)
    return pa.array(strings, pa.string()).take(indices)  # type: ignore[no-any-return]


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))


def _shrinkage(
    rt: StreamRuntime,
    agg: Aggregate,
    cells: np.ndarray,
    offsets: np.ndarray,
    prior: np.ndarray,
    previous: Featurizer | None,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``featurize.shrinkage = "empirical_bayes"``: per table σ² of a key's estimate (a cell's
    noise variance over the count period × the median's factor) and τ² per label
    (``featurize.eb_variance``, else estimated from the table's cells once per aggregate:
    ``previous``, a featurizer of the same aggregate and tables, gives its own); (None, None)
    otherwise."""
    fs = rt.config.featurize
    if fs.shrinkage != "empirical_bayes":
        return None, None
    spec = rt.spec
    cell_vars = [rt.noise.variance_for(rt.weight_of(t)) * max(agg.n_windows, 0) for t in rt.tables]
    sigma2s = np.array(cell_vars, dtype=np.float64) * MEDIAN_VARIANCE[spec.depth - 1]
    if fs.eb_variance is not None:
        return sigma2s, np.full((len(rt.tables), spec.n_labels), float(fs.eb_variance))
    if (
        previous is not None
        and previous.tau2s is not None
        and previous.rt.config.featurize.eb_variance is None
        and previous.sigma2s is not None
        and np.array_equal(previous.sigma2s, sigma2s)
    ):
        return sigma2s, previous.tau2s
    tau2s = np.zeros((len(rt.tables), spec.n_labels))
    shape = (spec.n_labels, spec.depth, spec.width)
    for j, start in enumerate(offsets.tolist()):
        table = cells[start : start + spec.cells].reshape(shape)
        tau2s[j] = between_variance(table, prior=prior, cell_variance=cell_vars[j])
    return sigma2s, tau2s
