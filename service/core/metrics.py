"""Quality metrics of probabilistic classifiers (pure numpy/scipy)."""

from __future__ import annotations

import numpy as np

EPS = 1e-15


def log_loss(y: np.ndarray, proba: np.ndarray) -> float:
    """Mean negative log-likelihood: −(1/n) Σ log p(y_i); ``proba`` is (n, L), ``y`` label
    indices (n,)."""
    if len(y) == 0:
        raise ValueError("log_loss of no rows")
    p = np.clip(proba[np.arange(len(y)), y], EPS, 1.0)
    return float(-np.mean(np.log(p)))


def binary_auc(y: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC by the rank-sum (Mann-Whitney U) identity, ties averaged; nan when one class
    is absent."""
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    from scipy.stats import rankdata  # here: scipy.stats costs every process 0.4 s to import

    ranks = rankdata(score)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def auc(y: np.ndarray, proba: np.ndarray) -> float:
    """Binary AUC of the second label's probability for two labels; the macro average of
    one-vs-rest AUCs otherwise (classes absent from ``y`` skipped)."""
    if proba.shape[1] == 2:
        return binary_auc(y, proba[:, 1])
    scores = [binary_auc((y == k).astype(int), proba[:, k]) for k in range(proba.shape[1])]
    scores = [s for s in scores if not np.isnan(s)]
    return float(np.mean(scores)) if scores else float("nan")
