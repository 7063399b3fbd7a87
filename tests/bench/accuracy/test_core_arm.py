"""The core arm counts with the service's own code: without noise its count-median estimates of
a movie are the exact counts (up to collisions in a wide sketch), and count-min never counts
low."""

from __future__ import annotations

import numpy as np
import pytest

from bench import lgbm, movielens
from bench.accuracy.core_arm import CoreArm
from bench.accuracy.plan import Privacy, Sketching

pytestmark = pytest.mark.skipif(
    not movielens.available(), reason=f"MovieLens 100K not found under {movielens.DATA}"
)


def test_estimates_without_noise() -> None:
    df = movielens.load().iloc[:20_000]
    core = CoreArm(df, Sketching(), lgbm.DEFAULT)
    rt = core.runtime(Privacy("none"))
    test = slice(10_000, 11_000)
    exact = core.exact_movie_counts(10_000, test)
    thresholds = [0.0] * len(rt.tables)
    for kind in ("median", "min"):
        x, est = core.featurize(rt, core.increments(10_000, kind), thresholds, test, kind)
        assert x.shape == (1000, 6 * len(rt.tables))
        assert est.shape == exact.shape
        if kind == "median":
            assert np.mean(est == exact) > 0.99
        else:
            assert (est >= exact).all()
    _, prior = core.increments(10_000, "median")
    assert prior.tolist() == np.bincount(core.labels[:10_000], minlength=2).tolist()
