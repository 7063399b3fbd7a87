from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import log_loss as sk_log_loss
from sklearn.metrics import roc_auc_score

from service.core.metrics import auc, binary_auc, log_loss


def test_against_scikit_learn() -> None:
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 500)
    p1 = np.clip(rng.random(500) * 0.5 + 0.5 * y * rng.random(500), 0.01, 0.99)
    proba = np.column_stack([1 - p1, p1])
    assert log_loss(y, proba) == pytest.approx(sk_log_loss(y, proba))
    assert auc(y, proba) == pytest.approx(roc_auc_score(y, p1))
    y3 = rng.integers(0, 3, 300)
    p3 = rng.dirichlet([1, 1, 1], 300)
    assert auc(y3, p3) == pytest.approx(roc_auc_score(y3, p3, multi_class="ovr"))


def test_hand_cases() -> None:
    assert binary_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.3, 0.4])) == 1.0
    assert binary_auc(np.array([0, 1]), np.array([0.5, 0.5])) == 0.5
    assert math.isnan(binary_auc(np.array([1, 1]), np.array([0.1, 0.2])))
    assert log_loss(np.array([0]), np.array([[0.5, 0.5]])) == pytest.approx(math.log(2))
