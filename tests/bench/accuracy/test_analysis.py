"""The accuracy report's figures from per-cut results."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from bench.accuracy.analysis import get, paired, summarise


def frame() -> pd.DataFrame:
    rows: list[tuple[object, ...]] = []
    for cut, base in ((1, 0.60), (2, 0.62)):
        rows.append(("baseline", None, None, cut, base, 0))
        for draw, (med, cmin) in enumerate(((0.66, 0.67), (0.64, 0.63))):
            rows.append(("core-median", 0.1, "laplace ε=1", cut, med, draw))
            rows.append(("core-min", 0.1, "laplace ε=1", cut, cmin, draw))
    return pd.DataFrame(rows, columns=["method", "share", "privacy", "cut", "log_loss", "draw"])


def test_summarise_ratios_and_spread() -> None:
    f = frame().assign(auc=0.7, rounds=10)
    g = summarise(f)
    base = get(g, "baseline")
    assert base is not None and base["ratio"] == pytest.approx(1.0)
    med = get(g, "core-median", 0.1, "laplace ε=1")
    assert med is not None and med["draws"] == 2
    assert med["ratio"] == pytest.approx(0.65 / 0.61)
    assert med["ratio_sd"] == pytest.approx(pd.Series([0.66, 0.64]).std() / 0.61)
    assert math.isnan(base["ratio_sd"])


def test_paired_draws() -> None:
    p = paired(frame())
    assert p is not None and (p.draws, p.configs) == (2, 1)
    assert p.mean == pytest.approx((0.67 / 0.66 - 1 + 0.63 / 0.64 - 1) / 2)
    assert p.lower_draws == 1
