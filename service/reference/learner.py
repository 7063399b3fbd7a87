"""LightGBM for the reference model: plain functions, run in the process pool."""

from __future__ import annotations

import numpy as np

PARAMS: dict[str, object] = {
    "learning_rate": 0.05,
    "num_leaves": 31,
    "min_data_in_leaf": 20,
    "feature_fraction": 0.9,
    "verbose": -1,
    "seed": 0,
    "deterministic": True,
    "num_threads": 1,
}
ROUNDS = 150


def fit(x: np.ndarray, y: np.ndarray, n_labels: int) -> str:
    """Train on (x, label indices y); returns the model as LightGBM's model string."""
    import lightgbm as lgb

    params: dict[str, object] = dict(PARAMS)
    if n_labels == 2:
        params["objective"] = "binary"
    else:
        params.update(objective="multiclass", num_class=n_labels)
    booster = lgb.train(params, lgb.Dataset(x, label=y), num_boost_round=ROUNDS)
    return str(booster.model_to_string())


def load(model: str):  # type: ignore[no-untyped-def]
    import lightgbm as lgb

    return lgb.Booster(model_str=model)


def predict_proba(booster, x: np.ndarray, n_labels: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    """(n, L) probabilities."""
    p = np.asarray(booster.predict(x))
    if n_labels == 2:
        return np.column_stack([1.0 - p, p])
    return p.reshape(len(x), n_labels)
