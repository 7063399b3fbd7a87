"""Count featurization: from rows of feature values to count-table keys, and from count
estimates to the documented columns (DESIGN §4).

Column names (stable; ``<t>`` is a table name, ``<l>`` a label):

* ``<t>:count:<l>`` estimated count of label ``l`` for the row's key, clamped at 0
* ``<t>:total``     n̂ = Σ_l max(ĉ_l, 0)
* ``<t>:p:<l>``     p_l = (max(ĉ_l, 0) + α·prior_l) / (n̂ + α), for every label but the first
                    (the first is 1 − Σ of the others)
* ``<t>:logodds:<l>`` log(p_l / (1 − p_l)) (Learning with Counts' log-odds, per label)
* ``<t>:backoff``   1.0 when n̂ < the back-off threshold; p and log-odds are then the prior's
* ``<f>:value``     the raw value of a numeric feature declared with ``passthrough``

A table over features (f1, ..., fk) is named ``f1+...+fk``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

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
    edge, len(edges) at or above the last)."""
    lo, hi = 0, len(edges)
    while lo < hi:
        mid = (lo + hi) // 2
        if value < edges[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


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
    Each distinct value is canonicalised once."""
    out: dict[str, list[bytes]] = {}
    for spec in features:
        memo: dict[object, bytes] = {}
        col: list[bytes] = []
        append = col.append
        name = spec.name
        for row in rows:
            v = row.get(name)
            try:
                b = memo[v]
            except KeyError:
                b = memo[v] = canonical_value(v, spec)
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


def prior_probabilities(prior_counts: np.ndarray) -> np.ndarray:
    """Label prior from the noisy prior table, add-one smoothed: (max(c_l,0)+1)/(Σ+L)."""
    c = np.maximum(np.asarray(prior_counts, dtype=np.float64), 0.0)
    return (c + 1.0) / (c.sum() + len(c))


def backoff_threshold(
    *, noise_variance: float, n_windows: int, n_labels: int, sigmas: float
) -> float:
    """n̂ below which a key's counts are treated as noise: ``sigmas`` standard deviations of
    the noise summed over the count period's windows, times sqrt(L) (DESIGN §4)."""
    return sigmas * math.sqrt(max(noise_variance, 0.0) * max(n_windows, 0)) * math.sqrt(n_labels)


def derived_columns(
    estimates: np.ndarray,
    *,
    prior: np.ndarray,
    alpha: float,
    threshold: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """From estimates ĉ (n, L) to (counts (n, L), total (n,), p (n, L), logodds (n, L),
    backoff (n,)), vectorised."""
    counts = np.maximum(estimates, 0.0)
    total = counts.sum(axis=1)
    p = (counts + alpha * prior[None, :]) / (total + alpha)[:, None]
    backoff = total < threshold
    if backoff.any():
        p[backoff] = prior[None, :]
    eps = 1e-6
    pc = np.clip(p, eps, 1.0 - eps)
    logodds = np.log(pc) - np.log1p(-pc)
    return counts, total, p, logodds, backoff.astype(np.float64)


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
