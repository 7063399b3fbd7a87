"""The speed benchmark's bookkeeping: ratios against targets, and a section of tables only."""

from __future__ import annotations

import pytest

from bench.report import Table
from bench.speed.batch import BatchResult
from bench.speed.report import Row, render, summarise


def test_row_ratio_and_targets() -> None:
    up = Row("k", "x", 120.0, 100.0, "rows/s", "≥ 1.0×")
    assert up.ratio == pytest.approx(1.2) and up.met
    assert not Row("k", "x", 20.0, 100.0, "rows/s", "≥ 0.3×").met
    assert Row("k", "x", 1.9, 1.0, "ms", "≤ 2.0×").met
    assert not Row("k", "x", 2.1, 1.0, "ms", "≤ 2.0×").met
    assert Row("k", "x", 5.0, 1.0, "ms", "").met  # information only
    assert up.fmt(1234.4) == "1,234 rows/s"
    assert Row("k", "x", 1, 1, "ms", "").fmt(1.5) == "1.50 ms"


def test_featurize_batch_rows_and_tables() -> None:
    b = BatchResult(1000, 0.5, 0.6, 1.0, 1.0, 2.0, 156, 247)
    rows = summarise(b, None)
    assert [r.key for r in rows] == ["featurize_te", "featurize_ce"]
    assert rows[0].ratio == pytest.approx(2.0) and rows[0].met and rows[1].target == ""
    parts = render(b, None, rows, before={"featurize_te": {"ours": 1000.0, "ratio": 0.5}})
    assert all(isinstance(p, Table) for p in parts)
    ratios = parts[0].markdown()
    assert "before optimisation" in ratios and "1,000 rows/s (0.50×)" in ratios
    assert "2.00×" in ratios and "| yes |" in ratios
