"""The streams the drift evaluation splits: a frame of features in stream order, a 0/1 label,
and windows (``DriftStream``).

* **MovieLens 100K** (``bench.movielens``), ratings in time order, ten windows of 10 % of the
  ratings each; the test windows are the last five (so the count period holds at least two
  windows with three hot windows). Features as the accuracy benchmark declares them (age
  numeric with its buckets, the rest categorical).
* **ACS employment, Massachusetts 2015-2018** (``bench.streams.acs``), four windows a year
  ("quarters": a year's rows in a fixed random order, ``SHUFFLE_SEED``, cut into four equal
  runs). Rows within a year carry no time order, and the file's order is not random (its
  quarters' label rates ranged from 0.44 to 0.53 within one year, against 0.496-0.505 between
  the years' means): shuffled, a quarter is a sample of its year's population, not a season,
  so a year boundary is a drift split (the test window is a new year's first quarter) and a
  split within a year the control (test and hot windows are samples of the same
  population). All 16 features categorical (age in whole years as a category)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from bench import movielens

NAMES = ("movielens", "acs")
SHUFFLE_SEED = 2015  # the order of the ACS rows within a year (public; not a noise source)


@dataclass(frozen=True)
class DriftStream:
    name: str
    title: str
    features: tuple[dict[str, Any], ...]  # the stream's features as StreamCreate declares them
    values: dict[str, np.ndarray]  # every row's value per feature, in stream order
    y: np.ndarray  # label 0/1 (float64)
    bounds: tuple[int, ...]  # window i holds rows bounds[i]:bounds[i + 1]
    window_names: tuple[str, ...]
    kinds: tuple[str, ...]  # per window as a test window: "drift" | "control" | "time"
    splits: tuple[int, ...]  # the test windows

    def window(self, i: int) -> slice:
        return slice(self.bounds[i], self.bounds[i + 1])

    def rows(self, first: int, stop: int) -> slice:
        """The rows of windows first .. stop - 1."""
        return slice(self.bounds[first], self.bounds[stop])

    @property
    def categorical(self) -> list[str]:
        return [f["name"] for f in self.features if f.get("kind", "categorical") == "categorical"]

    @functools.cached_property
    def raw_frame(self) -> pd.DataFrame:
        """Every row's raw features for LightGBM: categorical features as pandas categories over
        the whole stream (codes agree between slices), numeric ones as numbers."""
        cats = set(self.categorical)
        return pd.DataFrame(
            {
                name: pd.Categorical(v) if name in cats else v.astype(np.float64)
                for name, v in self.values.items()
            }
        )

    def rate(self, sl: slice) -> float:
        return float(self.y[sl].mean())


def equal_windows(start: int, stop: int, n: int) -> list[int]:
    """The first row of each of ``n`` equal runs of rows start .. stop - 1."""
    return [start + round(i * (stop - start) / n) for i in range(n)]


def movielens_stream(splits: Sequence[int] | None = None) -> DriftStream:
    df = movielens.load()
    values = {f: df[f].to_numpy() for f in movielens.FEATURES}
    n, windows = len(df), 10
    bounds = (*equal_windows(0, n, windows), n)
    names = tuple(f"{10 * i}-{10 * (i + 1)} %" for i in range(windows))
    return DriftStream(
        "movielens",
        "MovieLens 100K (10 % windows, time order)",
        tuple(movielens.stream_features()),
        values,
        movielens.labels01(df),
        bounds,
        names,
        ("time",) * windows,
        tuple(splits) if splits is not None else (5, 6, 7, 8, 9),
    )


def acs_stream(splits: Sequence[int] | None = None) -> DriftStream:
    from bench.streams import acs

    s = acs.load()
    years = sorted(set(s.year.tolist()))
    rng = np.random.default_rng(SHUFFLE_SEED)
    order = np.concatenate([rng.permutation(np.flatnonzero(s.year == y)) for y in years])
    year = s.year[order]
    starts: list[int] = []
    names: list[str] = []
    for y in years:
        at = np.flatnonzero(year == y)
        starts += equal_windows(int(at[0]), int(at[-1]) + 1, 4)
        names += [f"{y} Q{q}" for q in range(1, 5)]
    kinds = tuple("drift" if i % 4 == 0 else "control" for i in range(len(names)))
    return DriftStream(
        "acs",
        "ACS employment MA 2015-2018 (quarter-year windows)",
        tuple({"name": f, "kind": "categorical"} for f in acs.FEATURES),
        {k: v[order] for k, v in s.features.items()},
        s.label[order].astype(np.float64),
        (*starts, len(s)),
        tuple(names),
        kinds,
        tuple(splits) if splits is not None else (4, 5, 8, 9, 12, 13),
    )


def load(name: str, splits: Sequence[int] | None = None) -> DriftStream:
    if name == "movielens":
        return movielens_stream(splits)
    if name == "acs":
        return acs_stream(splits)
    raise ValueError(f"unknown stream {name!r}; choose from {', '.join(NAMES)}")
