"""The MovieLens ε-curve benchmark (``bench/reidentification/movielens.py``) runs end to end on a
small slice: both releases are audited through the service for each ε and the table names them,
with the baselines the attacks are read against."""

from __future__ import annotations

import re

import pytest

from bench.reidentification import movielens as bench
from service.audits import service as audits
from tests.conftest import shared_data

pytestmark = pytest.mark.slow  # an in-process service, two streams, eight small audits


def test_the_movielens_curve_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shared_data("movielens-100k", "ratings.parquet", "users.parquet", "items.parquet")
    monkeypatch.setattr(audits, "CONFIG", audits.CONFIG)  # main() sets it: restored after
    small = ["--t-pre", "20", "--t-tune", "20", "--pu-epochs", "2", "--oracle-epochs", "2"]
    bench.main(
        ["--count", "1500", "--hot", "300", "--eps", "1", "none", "--same", "--no-plot", *small]
    )
    out = capsys.readouterr().out
    for eps in ("1", "none"):
        for kind in ("count_tables", "class_mean"):
            row = re.search(rf"^\| {eps} \| {kind} \|(.*)\|$", out, flags=re.M)
            assert row, out
            cells = [c.strip() for c in row.group(1).split("|")]
            assert all(0 <= float(c) <= 100 for c in cells[:5]), row.group(0)
    assert re.search(r"n = 300 hot records, \d+ one-hot columns", out), out
