"""Count featurization: from rows of feature values to count-table keys, and from count
estimates to the documented columns (docs/ARCHITECTURE.md, "Featurization").

Column names (stable; ``<t>`` is a table name, ``<l>`` a label):

* ``<t>:count:<l>`` estimated count of label ``l`` for the row's key, clamped at 0
* ``<t>:total``     n̂ = Σ_l max(ĉ_l, 0)
* ``<t>:p:<l>``     p_l = (max(ĉ_l, 0) + α·prior_l) / (n̂ + α), for every label but the first
                    (the first is 1 − Σ of the others)
* ``<t>:logodds:<l>`` log(p_l / (1 − p_l)) (Learning with Counts' log-odds, per label)
* ``<t>:backoff``   1.0 when n̂ < the back-off threshold; p and log-odds are then the prior's
* ``<f>:value``     the raw value of a feature declared with ``passthrough``: a numeric
                    feature's as a float (NaN, JSON null, when missing or not a number), then
                    a categorical feature's as its string form (``canonical_value``: JSON
                    ``196`` and ``"196"`` are ``"196"``, booleans ``true``/``false``; null
                    when missing): an Arrow string column in the train set, a
                    string in featurize's JSON. The float columns come first, in this order;
                    the categorical values last (``Featurizer.value_columns``)

With ``featurize.shrinkage = "empirical_bayes"`` the same columns hold, per label against the
rest, ``<t>:logodds:<l>`` the log-odds shrunk toward the prior's by the key's noisy total and
the noise variance, ``<t>:p:<l>`` its logistic function, and no back-off replaces them (the
flag stays): ``service.core.features.shrinkage``. They replace the pseudo-count columns rather
than adding ``<t>:eb:<l>`` columns: a row keeps its width and schema (the train set, the Arrow
layout, the speed of a featurize), a model is compared on one estimator against the other
rather than on both against one, and the setting chooses one per stream.

A table over features (f1, ..., fk) is named ``f1+...+fk``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from service.core.features.shrinkage import shrink

MISSING = b"\x00"
SEPARATOR = b"\x1f"


@dataclass(frozen=True)
class FeatureSpec:
    name: str
    kind: str  # "categorical" | "numeric"
    buckets: tuple[float, ...] = ()
    passthrough: bool = False


def table_name(features: Sequence[str]) -> str:
    return "+".join(features)


def bucket_index(value: float, edges: Sequence[float]) -> int:
    """Bucket of a numeric value: i such that edges[i-1] <= value < edges[i] (0 below the first
    edge, len(edges) at or above the last; NaN, which compares false, gives len(edges)): the
    number of edges <= value, ``bisect_right`` (C speed)."""
    return bisect.bisect_right(edges, value)


def canonical_value(value: object, spec: FeatureSpec) -> bytes:
    """Canonical bytes of one feature value: categorical values by their string form (JSON
    ``196`` and ``"196"`` are the same category; booleans are ``true``/``false``), numeric
    values by their bucket, a missing value (absent or null) by a reserved byte."""
    if value is None:
        return MISSING
    if spec.kind == "numeric":
        return b"#%d" % bucket_index(float(value), spec.buckets)  # type: ignore[arg-type]
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).encode()


def row_keys(
    rows: Sequence[Mapping[str, object]],
    features: Sequence[FeatureSpec],
) -> dict[str, list[bytes]]:
    """Canonical bytes of every feature of every row: {feature name: [bytes per row]}.
    Each distinct value is canonicalised once (booleans apart from the numbers they equal:
    True == 1 as a dict key, but they canonicalise differently)."""
    out: dict[str, list[bytes]] = {}
    for spec in features:
        memo: dict[object, bytes] = {}
        col: list[bytes] = []
        append = col.append
        name = spec.name
        for row in rows:
            v = row.get(name)
            k = (bool, v) if v.__class__ is bool else v
            try:
                b = memo[k]
            except KeyError:
                b = memo[k] = canonical_value(v, spec)
            except TypeError:  # unhashable; validation forbids it, be safe anyway
                b = canonical_value(v, spec)
            append(b)
        out[name] = col
    return out


def table_keys(values: Mapping[str, list[bytes]], features: Sequence[str]) -> list[bytes]:
    """Keys of a table over ``features``: the rows' canonical values joined by a separator
    byte that canonical values never contain unescaped (categorical strings are limited and
    validated not to contain it)."""
    if len(features) == 1:
        return values[features[0]]
    cols = [values[f] for f in features]
    return [SEPARATOR.join(parts) for parts in zip(*cols, strict=True)]


@dataclass(frozen=True)
class Encoded:
    """One column's values as codes: ``codes[j]`` (int64) indexes ``keys``, the canonical bytes
    (``canonical_value``) of row ``j``'s value. Equal values share a code, so each distinct
    value is canonicalised and hashed once; distinct values may share a canonical key (JSON
    ``196`` and ``"196"``), which then hash alike."""

    codes: np.ndarray
    keys: list[bytes]


_NUMBER_TYPES = frozenset({int, float, bool, type(None)})
# Below this many rows, numpy's per-call overhead outweighs a loop over the values.
VECTORISE_FROM = 64


def _distinct_codes(values: Sequence[object], tagged: bool) -> tuple[list[int], list[object]]:
    """First-seen codes of ``values`` by Python equality; ``tagged`` keeps bools apart from the
    numbers they equal (True == 1 in a dict, but they canonicalise differently)."""
    if tagged:
        pairs: dict[tuple[bool, object], int] = {}
        codes = [pairs.setdefault((v.__class__ is bool, v), len(pairs)) for v in values]
        return codes, [v for _, v in pairs]
    memo: dict[object, int] = {}
    codes = [memo.setdefault(v, len(memo)) for v in values]
    return codes, list(memo)


def _first_codes(values: Sequence[object]) -> tuple[np.ndarray, list[object]]:
    """``_distinct_codes(values, tagged=False)``, with the codes as an int64 array. The dict is
    filled by ``map`` over ``dict.setdefault``, so no Python bytecode runs per value (a value
    maps to the position where it first occurs); the positions then become the dense
    first-seen codes with one gather (less time than a list comprehension and an ``asarray``
    of its list)."""
    n = len(values)
    memo: dict[object, int] = {}
    first = np.fromiter(map(memo.setdefault, values, itertools.count()), np.int64, n)
    dense = np.empty(n, np.int64)
    dense[np.fromiter(memo.values(), np.int64, len(memo))] = np.arange(len(memo))
    return dense[first], list(memo)


_STRING_KINDS = frozenset({str, type(None)})
_NUMBER_KINDS = frozenset({bool, int, float})


def encode_column(values: Sequence[object], spec: FeatureSpec) -> Encoded:
    """Codes and canonical keys of one feature's values (``canonical_value`` of every value,
    computed once per distinct value; numeric columns bucketised with one ``searchsorted``;
    the usual categorical column, strings and nulls, keyed without a call per value)."""
    n = len(values)
    if isinstance(values, np.ndarray) and values.dtype == object:
        values = values.tolist()  # iterating a list is much faster than an object array
    if spec.kind == "numeric" and n >= VECTORISE_FROM:
        fast = _encode_numeric(values, spec)
        if fast is not None:
            return fast
    try:
        codes, distinct = _first_codes(values)
        kinds = set(map(type, distinct))
        if spec.kind != "numeric" and kinds <= _STRING_KINDS:
            # canonical_value of a str is its UTF-8, of None MISSING
            keys = [MISSING if u is None else u.encode() for u in distinct]  # type: ignore[attr-defined]
            return Encoded(codes, keys)
        if (
            spec.kind != "numeric"
            and not kinds.isdisjoint(_NUMBER_KINDS)
            and any(
                u.__class__ is bool or (u.__class__ in (int, float) and (u == 0 or u == 1))
                for u in distinct
            )
        ):  # a bool and the number it equals may have merged: keep them apart (a numeric
            # feature buckets True as 1.0, so there they share a key anyway)
            tagged, distinct = _distinct_codes(values, tagged=True)
            codes = np.asarray(tagged, dtype=np.int64).reshape(n)
    except TypeError:  # unhashable; validation forbids it, be safe anyway
        memo: dict[bytes, int] = {}
        by_key = [memo.setdefault(canonical_value(v, spec), len(memo)) for v in values]
        return Encoded(np.asarray(by_key, dtype=np.int64).reshape(n), list(memo))
    keys = [canonical_value(v, spec) for v in distinct]
    return Encoded(codes, keys)


def _encode_numeric(values: Sequence[object], spec: FeatureSpec) -> Encoded | None:
    """Vectorised buckets of a column of numbers and nulls (None when it holds anything else:
    the caller then canonicalises value by value, exactly)."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        x = values.astype(np.float64, copy=False)
        none = np.zeros(x.shape, dtype=bool)
    else:
        if not set(map(type, values)) <= _NUMBER_TYPES:
            return None
        try:
            x = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            return None  # e.g. an int beyond float range: canonical_value raises the error
        if x.ndim != 1:
            return None
        nan = np.flatnonzero(np.isnan(x))
        none = np.zeros(x.shape, dtype=bool)
        if nan.size:
            none[nan] = [values[i] is None for i in nan.tolist()]
    return encode_numbers(x, none, spec)


def encode_numbers(x: np.ndarray, none: np.ndarray, spec: FeatureSpec) -> Encoded:
    """Codes and keys of a numeric feature from its values as float64 (``none``: the missing
    ones), as ``encode_column`` gives them: each value's bucket, missing values ``MISSING``."""
    edges = np.asarray(spec.buckets, dtype=np.float64)
    buckets = np.searchsorted(edges, x, side="right")  # bucket_index; NaN past the last edge
    buckets[none] = len(edges) + 1
    # Keep only the buckets that occur (a row of a featurize request hashes one key, not all).
    used = np.bincount(buckets, minlength=len(edges) + 2) > 0
    codes = (np.cumsum(used) - 1)[buckets].astype(np.int64)
    keys = [b"#%d" % i if i <= len(edges) else MISSING for i in np.flatnonzero(used).tolist()]
    return Encoded(codes, keys)


def distinct_keys(e: Encoded) -> Encoded:
    """``e`` with every key once: rows with equal keys share one code."""
    index: dict[bytes, int] = {}
    remap = np.fromiter((index.setdefault(k, len(index)) for k in e.keys), np.int64, len(e.keys))
    return Encoded(remap[e.codes], list(index))


def combine_codes(parts: Sequence[Encoded]) -> Encoded:
    """Codes and keys of a table over several features: a row's key is its features' canonical
    values joined by ``SEPARATOR`` (as ``table_keys``), one code per distinct combination."""
    if len(parts) == 1:
        return parts[0]
    codes, keys = parts[0].codes, parts[0].keys
    for part in parts[1:]:
        m = max(len(part.keys), 1)
        combined = codes * m + part.codes
        uniq, inverse = np.unique(combined, return_inverse=True)
        left, right = np.divmod(uniq, m)
        keys = [
            keys[a] + SEPARATOR + part.keys[b]
            for a, b in zip(left.tolist(), right.tolist(), strict=True)
        ]
        codes = inverse.reshape(-1).astype(np.int64, copy=False)
    return Encoded(codes, keys)


def passthrough_values(values: Sequence[object]) -> np.ndarray:
    """Raw values of a passed-through numeric feature, float64: numbers as they are, anything
    else (missing, booleans, strings) NaN."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        return values.astype(np.float64)
    if len(values) >= VECTORISE_FROM and set(map(type, values)) <= {int, float, type(None)}:
        return np.asarray(values, dtype=np.float64).reshape(len(values))
    return np.array(
        [
            float(v) if isinstance(v, int | float) and not isinstance(v, bool) else np.nan  # type: ignore[arg-type]
            for v in values
        ],
        dtype=np.float64,
    ).reshape(len(values))


def value_strings(keys: Sequence[bytes]) -> list[str | None]:
    """A categorical passthrough column's values from their canonical keys (``encode_column``'s
    keys): the string form, None for a missing value."""
    return [None if k == MISSING else k.decode("utf-8", "replace") for k in keys]


def prior_probabilities(prior_counts: np.ndarray) -> np.ndarray:
    """Label prior from the noisy prior table, add-one smoothed: (max(c_l,0)+1)/(Σ+L)."""
    c = np.maximum(np.asarray(prior_counts, dtype=np.float64), 0.0)
    return (c + 1.0) / (c.sum() + len(c))


def backoff_threshold(
    *, noise_variance: float, n_windows: int, n_labels: int, sigmas: float
) -> float:
    """n̂ below which a key's counts are treated as noise: ``sigmas`` standard deviations of
    the noise summed over the count period's windows, times sqrt(L) (docs/ARCHITECTURE.md,
    "Featurization")."""
    return sigmas * math.sqrt(max(noise_variance, 0.0) * max(n_windows, 0)) * math.sqrt(n_labels)


def derived_columns(
    estimates: np.ndarray,
    *,
    prior: np.ndarray,
    alpha: float,
    threshold: float | np.ndarray,
    sigma2: float | np.ndarray | None = None,
    tau2: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """From estimates ĉ (n, L) to (counts (n, L), total (n,), p (n, L), logodds (n, L),
    backoff (n,)), vectorised. ``threshold``: one, or one per row (each row's table's).
    With ``tau2`` (τ² per label, or per row and label) p and log-odds are the empirical-Bayes
    ones (``shrinkage.shrink``, σ² ``sigma2``: one or one per row) and no back-off applies."""
    counts = np.maximum(estimates, 0.0)
    total = counts.sum(axis=1)
    if tau2 is not None:
        p, logodds = shrink(
            estimates, prior=prior, sigma2=0.0 if sigma2 is None else sigma2, tau2=tau2
        )
        return counts, total, p, logodds, (total < threshold).astype(np.float64)
    p = (counts + alpha * prior[None, :]) / (total + alpha)[:, None]
    backoff = total < threshold
    if backoff.any():
        p[backoff] = prior[None, :]
    eps = 1e-6
    pc = np.clip(p, eps, 1.0 - eps)
    logodds = np.log(pc) - np.log1p(-pc)
    return counts, total, p, logodds, backoff.astype(np.float64)


def derived_blocks(
    estimates: Sequence[Sequence[float]],
    *,
    prior: Sequence[float],
    alpha: float,
    thresholds: Sequence[float],
) -> list[bytes]:
    """``derived_columns`` and ``assemble`` of a few keys (one table block of ``column_names``
    per key, as float64 bytes), computed in Python floats: a numpy call on a handful of values
    costs more than its arithmetic, several µs each once a request's other work has evicted
    numpy from the CPU caches (~25 calls: most of a one-row featurize with new keys). Bit for
    bit ``derived_columns``: the same IEEE operations in the same order (a test pins it on
    random estimates); the logarithms are numpy's (its SIMD log is not libm's), one call each
    over all keys, and so is a sum over more than two labels (its order is numpy's)."""
    n_labels = len(prior)
    eps = 1e-6
    top = 1.0 - eps
    # Only labels 1.. have p and log-odds columns: label 0's are never computed.
    rest = list(prior[1:])
    scaled = [alpha * q for q in rest]  # alpha * prior[None, :]
    counts = [[c if c >= 0.0 else 0.0 for c in row] for row in estimates]  # never -0.0 or NaN
    if n_labels == 2:
        totals = [c0 + c1 for c0, c1 in counts]
    else:
        table = np.asarray(counts, dtype=np.float64).reshape(len(counts), n_labels)
        totals = table.sum(axis=1).tolist()
    probs: list[list[float]] = []
    clipped: list[float] = []
    backoff: list[float] = []
    for row, total, threshold in zip(counts, totals, thresholds, strict=True):
        if total < threshold:
            p = rest
            backoff.append(1.0)
        else:
            denominator = total + alpha
            p = [(c + a) / denominator for c, a in zip(row[1:], scaled, strict=True)]
            backoff.append(0.0)
        probs.append(p)
        clipped += [eps if q < eps else (top if q > top else q) for q in p]
    pc = np.asarray(clipped, dtype=np.float64)
    logodds = (np.log(pc) - np.log1p(-pc)).tolist()
    pack = struct.Struct(f"{3 * n_labels}d").pack  # native float64, as numpy's
    m = n_labels - 1
    return [
        pack(*row, total, *p, *logodds[k * m : (k + 1) * m], off)
        for k, (row, total, p, off) in enumerate(zip(counts, totals, probs, backoff, strict=True))
    ]


def column_names(
    tables: Sequence[str], labels: Sequence[str], passthrough: Sequence[str]
) -> list[str]:
    cols: list[str] = []
    for t in tables:
        cols += [f"{t}:count:{lab}" for lab in labels]
        cols.append(f"{t}:total")
        cols += [f"{t}:p:{lab}" for lab in labels[1:]]
        cols += [f"{t}:logodds:{lab}" for lab in labels[1:]]
        cols.append(f"{t}:backoff")
    cols += [f"{f}:value" for f in passthrough]
    return cols


def assemble(
    per_table: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    passthrough: Sequence[np.ndarray],
    n_rows: int,
) -> np.ndarray:
    """Stack the derived columns of every table (in ``column_names`` order) into (n, C)."""
    blocks: list[np.ndarray] = []
    for counts, total, p, logodds, backoff in per_table:
        blocks += [counts, total[:, None], p[:, 1:], logodds[:, 1:], backoff[:, None]]
    blocks += [v[:, None] for v in passthrough]
    if not blocks:
        return np.zeros((n_rows, 0))
    return np.hstack(blocks).astype(np.float64, copy=False)
