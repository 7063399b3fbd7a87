"""Count-Mean-Min with conservative update (DESIGN §11)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.cmm import CMMSpec, CountMeanMin, cells, estimate


def d(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=400))
def test_min_never_under_counts_and_estimate_stays_below_it(items: list[int]) -> None:
    sk = CountMeanMin(CMMSpec(width=256, depth=2))
    plain = np.zeros((2, 256), dtype=np.int64)  # count-min without conservative update
    for x in items:
        sk.update(d(x))
        plain[np.arange(2), cells(d(x), sk.spec)] += 1
    truth = {x: items.count(x) for x in set(items)}
    for x, n in truth.items():
        assert sk.upper(d(x)) >= n
        assert 0 <= sk.estimate(d(x)) <= sk.upper(d(x))
    assert (sk.table <= plain).all()  # conservative update raises no cell more than count-min


def test_estimate_formula_by_hand() -> None:
    # r_i = c_i − (N_i − c_i)/(w − 1): c = (5, 7, 6), N = (260, 262, 261), w = 256
    r = [5 - 255 / 255, 7 - 255 / 255, 6 - 255 / 255]
    assert estimate(np.array([5, 7, 6]), np.array([260, 262, 261]), 256) == pytest.approx(
        float(np.median(r))
    )
    # clamped to [0, min c]
    assert estimate(np.array([1, 1]), np.array([10_000, 10_000]), 256) == 0.0


def test_cells_are_per_row_and_in_range() -> None:
    spec = CMMSpec(width=1024, depth=4)
    cs = [cells(d(i), spec) for i in range(2000)]
    assert all(0 <= c < 1024 for row in cs for c in row)
    # rows hash independently: the same item rarely has equal cells in rows 0 and 1
    assert sum(r[0] == r[1] for r in cs) < 20


def test_round_trip_and_merge() -> None:
    spec = CMMSpec(width=256, depth=3)
    a, b = CountMeanMin(spec), CountMeanMin(spec)
    for i in range(100):
        a.update(d(i % 7))
        b.update(d(i % 5))
    back = CountMeanMin.from_bytes(a.to_bytes(), spec)
    assert (back.table == a.table).all()
    a.merge(b)
    assert a.upper(d(0)) >= 15 + 20
    with pytest.raises(ValueError, match="cannot merge"):
        a.merge(CountMeanMin(CMMSpec(width=512, depth=3)))


@pytest.mark.parametrize(
    ("width", "depth"), [(300, 4), (128, 4), (1 << 23, 4), (1024, 1), (1024, 9)]
)
def test_spec_bounds(width: int, depth: int) -> None:
    with pytest.raises(ValueError, match="width|depth"):
        CMMSpec(width=width, depth=depth)
