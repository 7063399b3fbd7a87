"""The count-period aggregate's storage: int32 like the tables, saturating, layout-aware."""

from __future__ import annotations

import numpy as np

from service.core.tables.aggregate import Aggregate
from service.core.tables.cells import INT32_MAX, INT32_MIN


def test_round_trip_and_saturation() -> None:
    cells = np.array([1, -2, 3, 4, INT32_MAX + 10, INT32_MIN - 10, 7], np.int64)
    agg = Aggregate(5, 2, 4, [2, 3, 4], [(11, 2), (12, 2), (13, 2)], cells)
    back = Aggregate.from_redis({k.encode(): v for k, v in agg.to_redis().items()})
    assert (back.epoch, back.lo, back.hi, back.windows) == (5, 2, 4, [2, 3, 4])
    assert back.layout == agg.layout
    np.testing.assert_array_equal(back.cells, [1, -2, 3, 4, INT32_MAX, INT32_MIN, 7])
    assert set(back.tables) == {11, 12, 13}
    np.testing.assert_array_equal(back.tables[12], [3, 4])
    np.testing.assert_array_equal(back.prior, [7])


def test_aligned_fills_new_tables_with_zeros_and_keeps_the_prior() -> None:
    agg = Aggregate(3, 1, 2, [1, 2], [(1, 2), (2, 2)], np.array([1, 2, 3, 4, 9, 8], np.int64))
    same = agg.aligned([(1, 2), (2, 2)], 2)
    same[0] = 100
    assert agg.cells[0] == 1  # a copy
    grown = agg.aligned([(1, 2), (3, 2), (2, 2)], 2)
    np.testing.assert_array_equal(grown, [1, 2, 0, 0, 3, 4, 9, 8])
    empty = Aggregate(1, -1, 0, [], [], np.zeros(2, np.int64))
    np.testing.assert_array_equal(empty.aligned([(1, 2)], 2), [0, 0, 0, 0])


def test_stored_in_pieces_and_read_back_whole(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Cells are stored in pieces of at most CHUNK_BYTES named by the version's token; an
    aggregate stored whole before that (one ``cells`` field) still reads."""
    from service.core.tables import aggregate as aggregate_mod
    from service.core.tables import cells as cell_codec

    monkeypatch.setattr(aggregate_mod, "CHUNK_BYTES", 12)
    cells = np.arange(-5, 9, dtype=np.int64)
    agg = Aggregate(2, 1, 1, [1], [(4, 12)], cells)
    stored = agg.to_redis("abc")
    assert sorted(stored) == ["c:abc:0", "c:abc:1", "c:abc:2", "c:abc:3", "c:abc:4", "meta"]
    assert all(len(v) <= 12 for k, v in stored.items() if k != "meta")
    back = Aggregate.from_redis({k.encode(): v for k, v in stored.items()})
    np.testing.assert_array_equal(back.cells, cells)
    old_meta = b'{"epoch":2,"lo":1,"hi":1,"windows":[1],"tables":[[4,12]]}'
    old = Aggregate.from_redis({b"meta": old_meta, b"cells": cell_codec.encode(cells)})
    np.testing.assert_array_equal(old.cells, cells)
