"""A synthetic click log shaped like Criteo's display-advertising data: the product's demo data
(``selectivity demo``) and the benchmarks' data at scale (millions of rows) without real data.

* ``C1 … C26``: categorical features. Feature ``j`` has ``cardinalities[j]`` categories, spaced
  geometrically from ``min_cardinality`` to ``max_cardinality`` (10^6 by default), and its values
  follow a finite Zipf law: the category of popularity rank ``r`` (1-based) has probability
  ``r^-s / H(card, s)``. Category names are 8 hex characters, as in Criteo; each feature has a
  small rate of missing values.
* ``I1 … I13``: numeric features, non-negative integer counts ``floor(exp(N(mu_k, sigma_k)))``
  with a per-feature missing rate; ``numeric_edges()`` gives power-of-two bucket edges for them.
* ``label``: a known logistic ground truth,
  ``logit = b0 + sum_j effect_j[category] + sum_k beta_k * z_k``, with ``effect_j`` drawn
  N(0, ``effect_sigma``) per category, ``z_k`` the standardised ``log1p`` of count ``k`` (0 when
  missing), and ``label ~ Bernoulli(sigmoid(logit))``. ``ClickLog.p`` is the true probability;
  a missing categorical value hides its category from the features, not from the truth.

Everything is vectorised numpy and seeded: the same ``(n_rows, seed, spec)`` always gives the
same log (demo and benchmark data, not noise: the service's noise comes from the CSPRNG).
Categorical values are held as codes and turned into strings only on request, sharing one string
object per category (``vocabulary``), so that a million-row log stays a few hundred MB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

__all__ = ["ClickLog", "ClickLogSpec", "generate", "numeric_edges", "stream_body"]

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_GOLDEN = np.uint64(2654435761)  # odd: multiplication mod 2^32 is a bijection


@dataclass(frozen=True)
class ClickLogSpec:
    n_categorical: int = 26
    n_numeric: int = 13
    min_cardinality: int = 4
    max_cardinality: int = 1_000_000
    zipf_exponent: float = 1.1
    categorical_missing: float = 0.02
    numeric_missing_max: float = 0.4  # missing rates spread over [0, this]
    effect_sigma: float = 0.35  # per-category effect on the logit
    numeric_beta_sigma: float = 0.3
    intercept: float = -1.6  # with the effects above: a click rate near 0.22 (Criteo: ~0.26)

    @property
    def cardinalities(self) -> np.ndarray:
        return (
            np.geomspace(self.min_cardinality, self.max_cardinality, self.n_categorical)
            .round()
            .astype(np.int64)
        )

    @property
    def categorical_names(self) -> list[str]:
        return [f"C{j + 1}" for j in range(self.n_categorical)]

    @property
    def numeric_names(self) -> list[str]:
        return [f"I{k + 1}" for k in range(self.n_numeric)]


@dataclass(frozen=True)
class Truth:
    """The logistic ground truth (indexable by category code and numeric feature)."""

    intercept: float
    effects: list[np.ndarray]  # per categorical feature: effect of each category code
    beta: np.ndarray  # (n_numeric,)
    log_mean: np.ndarray  # standardisation of log1p(count)
    log_std: np.ndarray


@dataclass
class ClickLog:
    spec: ClickLogSpec
    seed: int
    codes: np.ndarray  # (n, n_categorical) int32 category codes, -1 = missing
    numeric: np.ndarray  # (n, n_numeric) float64 counts, NaN = missing
    label: np.ndarray  # (n,) int8 in {0, 1}
    p: np.ndarray  # (n,) true click probability
    truth: Truth = field(repr=False)

    def __len__(self) -> int:
        return int(self.label.shape[0])

    @property
    def feature_names(self) -> list[str]:
        return self.spec.categorical_names + self.spec.numeric_names

    @cached_property
    def vocabulary(self) -> list[np.ndarray]:
        """Per categorical feature: object array of category strings by code (one shared
        ``str`` per category; entry ``card`` is None, for the missing code -1)."""
        out = []
        for j, card in enumerate(self.spec.cardinalities.tolist()):
            scrambled = (np.arange(card, dtype=np.uint64) * _GOLDEN + np.uint64(j * 7919)) & (
                np.uint64(0xFFFFFFFF)
            )
            names = _hex8(scrambled.astype(np.uint32)).astype(object)
            out.append(np.concatenate([names, np.array([None], dtype=object)]))
        return out

    def categorical(self, j: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Object array of feature ``C{j+1}``'s values (str, or None when missing)."""
        return self.vocabulary[j][self.codes[start:stop, j]]  # code -1 picks the trailing None

    def numeric_values(self, k: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Object array of feature ``I{k+1}``'s values (int, or None when missing)."""
        col = self.numeric[start:stop, k]
        out = np.empty(col.shape[0], dtype=object)
        ok = ~np.isnan(col)
        out[ok] = col[ok].astype(np.int64).tolist()
        return out

    def columns(
        self, start: int = 0, stop: int | None = None, *, numeric: bool = True
    ) -> dict[str, np.ndarray]:
        """Columnar view: {feature name: object array of values}."""
        cols = {
            name: self.categorical(j, start, stop)
            for j, name in enumerate(self.spec.categorical_names)
        }
        if numeric:
            for k, name in enumerate(self.spec.numeric_names):
                cols[name] = self.numeric_values(k, start, stop)
        return cols

    def rows(
        self, start: int = 0, stop: int | None = None, *, numeric: bool = True
    ) -> list[dict[str, Any]]:
        """Rows as the API takes them (missing values omitted)."""
        cols = self.columns(start, stop, numeric=numeric)
        names = list(cols)
        lists = [cols[n].tolist() for n in names]
        return [
            {n: v for n, v in zip(names, vals, strict=True) if v is not None}
            for vals in zip(*lists, strict=True)
        ]

    def observations(self, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
        """Ingest bodies' observations: id ``r<index>``, features, label ``"0"``/``"1"``."""
        stop = len(self) if stop is None else min(stop, len(self))
        labels = self.label[start:stop].tolist()
        return [
            {"id": f"r{start + i}", "features": row, "label": "1" if y else "0"}
            for i, (row, y) in enumerate(zip(self.rows(start, stop), labels, strict=True))
        ]

    def frame(self, start: int = 0, stop: int | None = None, *, numeric: bool = False) -> Any:
        """A pandas DataFrame of the same values (for the scikit-learn style baselines)."""
        import pandas as pd

        return pd.DataFrame(self.columns(start, stop, numeric=numeric))


def _hex8(words: np.ndarray) -> np.ndarray:
    """uint32 -> '<U8' lower-case hex, vectorised."""
    shifts = np.arange(28, -1, -4, dtype=np.uint32)
    nibbles = (words.astype(np.uint32)[:, None] >> shifts) & np.uint32(0xF)
    return np.ascontiguousarray(_HEX[nibbles]).view("S8").ravel().astype("U8")


def _zipf_codes(rng: np.random.Generator, n: int, card: int, s: float) -> np.ndarray:
    """n draws of popularity ranks 0..card-1 from a finite Zipf law, by inverse CDF."""
    weights = np.arange(1, card + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), card - 1)


def generate(n_rows: int, *, seed: int = 0, spec: ClickLogSpec | None = None) -> ClickLog:
    """The click log of ``n_rows`` rows (about 1.5 s per million rows)."""
    spec = spec or ClickLogSpec()
    if n_rows < 1:
        raise ValueError(f"n_rows must be >= 1, got {n_rows=}")
    rng = np.random.default_rng(seed)
    cards = spec.cardinalities.tolist()
    codes = np.empty((n_rows, spec.n_categorical), dtype=np.int32)
    logit = np.full(n_rows, spec.intercept)
    effects: list[np.ndarray] = []
    for j, card in enumerate(cards):
        ranks = _zipf_codes(rng, n_rows, card, spec.zipf_exponent)
        # Popularity rank -> category code, so that code order says nothing about popularity.
        col = rng.permutation(card)[ranks].astype(np.int32)
        effect = rng.normal(0.0, spec.effect_sigma, card)
        logit += effect[col]
        col[rng.random(n_rows) < spec.categorical_missing] = -1
        codes[:, j] = col
        effects.append(effect)
    mu = rng.uniform(0.0, 4.0, spec.n_numeric)
    sigma = rng.uniform(0.5, 2.0, spec.n_numeric)
    missing = rng.uniform(0.0, spec.numeric_missing_max, spec.n_numeric)
    beta = rng.normal(0.0, spec.numeric_beta_sigma, spec.n_numeric)
    log_mean = np.log1p(np.exp(mu))  # fixed standardisation (part of the truth, not the data)
    log_std = sigma
    numeric = np.floor(np.exp(rng.normal(mu, sigma, (n_rows, spec.n_numeric))))
    z = (np.log1p(numeric) - log_mean) / log_std
    numeric[rng.random((n_rows, spec.n_numeric)) < missing] = np.nan
    logit += np.where(np.isnan(numeric), 0.0, z) @ beta
    p = 1.0 / (1.0 + np.exp(-logit))
    label = (rng.random(n_rows) < p).astype(np.int8)
    truth = Truth(spec.intercept, effects, beta, log_mean, log_std)
    return ClickLog(spec, seed, codes, numeric, label, p, truth)


def numeric_edges(max_power: int = 16) -> list[float]:
    """Bucket edges for the counts: 1, 2, 4, ..., 2^max_power (bucket 0 holds the zeros)."""
    return [float(2**i) for i in range(max_power + 1)]


def stream_body(
    name: str,
    spec: ClickLogSpec | None = None,
    *,
    numeric: bool = True,
    passthrough: bool = True,
    **over: Any,
) -> dict[str, Any]:
    """A stream registration for the log: every feature counted in its own table, numeric
    counts bucketised by ``numeric_edges()`` (and passed through raw)."""
    spec = spec or ClickLogSpec()
    features: list[dict[str, Any]] = [
        {"name": n, "kind": "categorical"} for n in spec.categorical_names
    ]
    if numeric:
        features += [
            {"name": n, "kind": "numeric", "buckets": numeric_edges(), "passthrough": passthrough}
            for n in spec.numeric_names
        ]
    body: dict[str, Any] = {
        "name": name,
        "features": features,
        "labels": ["0", "1"],
        "window_seconds": 86400,
        "hot_windows": 1,
        "retention_windows": 30,
        "privacy": {"mechanism": "laplace", "epsilon": 1.0},
    }
    body.update(over)
    return body
