"""MovieLens 100K as Selectivity observations: the loader lives in ``bench.movielens`` (shared
with the accuracy benchmark); this module re-exports it for the tests."""

from bench.movielens import (
    AGE_BUCKETS,
    CATEGORICAL,
    DATA,
    FEATURES,
    available,
    feature_rows,
    genre_columns,
    labels01,
    load,
    observations,
    raw_frame,
    stream_features,
)

__all__ = [
    "AGE_BUCKETS",
    "CATEGORICAL",
    "DATA",
    "FEATURES",
    "available",
    "feature_rows",
    "genre_columns",
    "labels01",
    "load",
    "observations",
    "raw_frame",
    "stream_features",
]
