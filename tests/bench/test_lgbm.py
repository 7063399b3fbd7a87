"""LightGBM as the benchmarks fit it: early-stopped rounds, a refit, seeds averaged."""

from __future__ import annotations

import numpy as np

from bench import lgbm


def test_fit_predict_learns_a_simple_rule() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 3))
    y = (x[:, 0] + 0.1 * rng.normal(size=2000) > 0).astype(np.float64)
    training = lgbm.Training(max_rounds=50, patience=5, seeds=(1, 2))
    p, rounds = lgbm.fit_predict(x[:1500], y[:1500], x[1500:], training)
    assert p.shape == (500,) and 1 <= rounds <= 50
    assert lgbm.auc(y[1500:], p) > 0.95
    assert lgbm.log_loss(y[1500:], p) < lgbm.log_loss(y[1500:], np.full(500, y.mean()))
    described = {str(k): v for k, v in lgbm.describe(training)}
    assert described["seeds (predictions averaged)"] == "1, 2"
