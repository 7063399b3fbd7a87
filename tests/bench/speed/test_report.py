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
    parts = render(b, None, rows)
    assert all(isinstance(p, Table) for p in parts)
    ratios = parts[0].markdown()
    assert "2.00×" in ratios and "| yes |" in ratios


def test_ratios_are_medians_of_paired_repeats() -> None:
    """Each repeat's featurize p50 ÷ its own no-op p50 (measured interleaved), then the median:
    a repeat slowed by load as a whole moves neither."""
    from bench.speed.http_bench import HttpResult

    runs = [
        {"featurize": [1.0, 1.2, 1.1], "noop": [1.0, 1.0, 1.0], "noop_last": [2.0] * 3},
        {"featurize": [3.3, 3.3, 3.3], "noop": [3.0, 3.0, 3.0], "noop_last": [2.0] * 3},
        {"featurize": [1.3, 1.3, 1.3], "noop": [1.0, 1.0, 1.0], "noop_last": [2.0] * 3},
    ]
    pooled = {k: [x for r in runs for x in r[k]] for k in runs[0]}
    h = HttpResult(pooled, [], [], [], [], 1000, latency_runs=runs)
    rows = summarise(None, h)
    assert [r.key for r in rows] == ["latency_p50", "latency_p99", "latency_p50_first"]
    assert rows[0].ratio == pytest.approx(1.1) and rows[0].spread == "1.10–1.30×"
    assert rows[0].met  # 1.1 ≤ 1.2 although the pooled p50s give 1.3 / 1.0
    assert render(None, h, rows)[0].markdown().count("|") > 0
    assert len(render(None, h, rows)) == 1  # no ingest: no ingest or train-set tables
    b = BatchResult(1000, 0.5, 0.6, 1.0, 1.0, 2.0, 156, 247)
    b.runs = {"ours_columns": [0.5, 1.0, 0.4], "target_encoder": [1.0, 1.5, 1.2]}
    (te, _) = summarise(b, None)
    assert te.ratio == pytest.approx(2.0) and te.spread == "1.50–3.00×"
