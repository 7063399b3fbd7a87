"""LightGBM as the benchmarks train it, and the metrics they score it with.

Every model of a comparison is fitted the same way (``Training``): the number of rounds is chosen
by early stopping on the last ``valid_share`` (in time) of the model's training rows, then the
model is refit on all of them with that many rounds; predictions are averaged over ``seeds``
(which halves the run-to-run spread of the figures). Pandas ``category`` columns are native
categorical features."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd
from sklearn.metrics import log_loss as _sk_log_loss
from sklearn.metrics import roc_auc_score

PARAMS: tuple[tuple[str, Any], ...] = tuple(
    {
        "objective": "binary",
        "learning_rate": 0.05,
        "num_leaves": 15,
        "min_data_in_leaf": 50,
        "feature_fraction": 0.8,
        "bagging_fraction": 0.8,
        "bagging_freq": 1,
        "lambda_l2": 1.0,
        "deterministic": True,
        "force_col_wise": True,
        # One thread: the accuracy benchmark keeps both cores busy with two worker processes
        # (and a model trains while other streams ingest); with 2 OpenMP threads on a busy
        # 2-core machine the spinning threads made every fit 10-20× slower.
        "num_threads": 1,
        "verbose": -1,
    }.items()
)


@dataclass(frozen=True)
class Training:
    params: tuple[tuple[str, Any], ...] = PARAMS  # LightGBM's, in order (hashable, picklable)
    max_rounds: int = 1000
    patience: int = 50
    valid_share: float = 0.2
    seeds: tuple[int, ...] = (7, 8, 9)


DEFAULT = Training()


def _rows(x: Any, sl: slice) -> Any:
    return x.iloc[sl] if isinstance(x, pd.DataFrame) else x[sl]


def fit_predict(
    x_train: Any,
    y_train: np.ndarray,
    x_test: Any,
    training: Training = DEFAULT,
    *,
    weight: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """Fit on time-ordered training rows, predict the test rows: the mean prediction over the
    seeds, and the mean number of rounds. ``weight``: one per training row (default 1)."""
    n = len(y_train)
    n_fit = n - max(int(n * training.valid_share), 1)
    preds, rounds = [], []
    for seed in training.seeds:
        params = {**dict(training.params), "seed": seed}
        w_fit, w_valid = (None, None) if weight is None else (weight[:n_fit], weight[n_fit:])
        fit = lgb.Dataset(
            _rows(x_train, slice(0, n_fit)), y_train[:n_fit], weight=w_fit, free_raw_data=False
        )
        valid = lgb.Dataset(
            _rows(x_train, slice(n_fit, n)), y_train[n_fit:], weight=w_valid, reference=fit
        )
        probe = lgb.train(
            params,
            fit,
            num_boost_round=training.max_rounds,
            valid_sets=[valid],
            callbacks=[lgb.early_stopping(training.patience, verbose=False)],
        )
        rounds.append(max(int(probe.best_iteration or training.max_rounds), 1))
        full = lgb.Dataset(x_train, y_train, weight=weight)
        model = lgb.train(params, full, num_boost_round=rounds[-1])
        preds.append(np.asarray(model.predict(x_test), dtype=np.float64))
    return np.mean(preds, axis=0), round(statistics.mean(rounds))


def log_loss(y: np.ndarray, p: np.ndarray) -> float:
    """Binary log-loss of 0/1 labels ``y`` and probabilities ``p`` of label 1."""
    return float(_sk_log_loss(y, np.clip(p, 1e-15, 1 - 1e-15), labels=[0.0, 1.0]))


def auc(y: np.ndarray, p: np.ndarray) -> float:
    return float(roc_auc_score(y, p))


def describe(training: Training) -> list[list[object]]:
    """The training setup as table rows (parameter, value)."""
    params = ", ".join(f"{k}={v}" for k, v in training.params if k != "verbose")
    return [
        ["LightGBM parameters", params],
        [
            "rounds",
            f"early stopping (patience {training.patience}, at most "
            f"{training.max_rounds}) on the last {training.valid_share:.0%} of the training "
            "rows, then a refit on all of them",
        ],
        ["seeds (predictions averaged)", ", ".join(map(str, training.seeds))],
    ]
