"""The counting math (``service.core.features.counting``): a batch's increments per table and cell,
the
packed BITFIELD arguments, whole-table addition that saturates as BITFIELD does."""

from __future__ import annotations

import numpy as np

from service.core.features import counting as counting_math
from service.core.features.columns import row_keys, table_keys
from service.core.tables.sketch import aggregate_increments, hash_keys
from service.ingest.schemas import IngestIn
from tests.helpers import batch_ops, obs, runtime


def test_batch_ops_sum_increments_per_cell() -> None:
    """Two identical observations make one op of +2 (or -2) per row, not two ops."""
    rt = runtime()
    body = IngestIn.model_validate({"observations": [obs("u", "i", 20, "1")] * 2})
    _, ops, rows = batch_ops(rt, body)
    assert len(rows) == 2
    for table_ops in ops[:-1]:
        _, deltas = counting_math.unpack_ops(table_ops)
        assert len(deltas) == rt.spec.depth and all(abs(d) == 2 for d in deltas.tolist())
    assert ops[-1] == counting_math.pack_ops(np.array([1]), np.array([2]))  # prior: "1" twice
    cells, deltas = counting_math.unpack_ops(ops[-1])
    assert (cells.tolist(), deltas.tolist()) == ([1], [2])


def test_batch_ops_equal_the_per_table_reference() -> None:
    """Increments computed per distinct (label, key) for all tables at once are exactly the
    per-observation, per-table sums (canonical keys, the pinned hash, aggregate_increments)."""
    rt = runtime()
    rng = np.random.default_rng(11)
    pool = ["u1", "u2", "196", 196, 196.0, True, 1, False, 0, None, "é"]
    observations = [
        obs(
            pool[int(rng.integers(0, len(pool)))],  # type: ignore[arg-type]
            pool[int(rng.integers(0, len(pool)))],  # type: ignore[arg-type]
            float(rng.choice([5, 18, 24.5, 25, 60])),
            str(rng.integers(0, 2)),
        )
        for _ in range(700)
    ]
    body = IngestIn.model_validate({"observations": observations})
    table_ids, ops, rows = batch_ops(rt, body)
    feats = [o.features for o in body.observations]
    labels = np.array([rt.label_index[o.label] for o in body.observations])
    values = row_keys(feats, rt.features)
    assert table_ids == [t.id for t in rt.tables] and len(ops) == len(table_ids) + 1
    for t, packed in zip(rt.tables, ops, strict=False):
        b, s = hash_keys(
            table_keys(values, t.features), seed=rt.hash_seed, table=t.name, spec=rt.spec
        )
        want_cells, want_deltas = aggregate_increments(labels, b, s, rt.spec)
        cells, deltas = counting_math.unpack_ops(packed)
        assert np.array_equal(cells, want_cells) and np.array_equal(deltas, want_deltas)
        assert packed == b" ".join(
            b"#%d %d" % (c, d)
            for c, d in zip(want_cells.tolist(), want_deltas.tolist(), strict=True)
        )
    prior_cells, prior_deltas = counting_math.unpack_ops(ops[-1])
    assert prior_deltas.tolist() == np.bincount(labels)[prior_cells].tolist()
    assert len(rows) == 700


def test_pack_ops_is_the_decimal_bitfield_arguments() -> None:
    rng = np.random.default_rng(4)
    for _ in range(200):
        m = int(rng.integers(1, 40))
        cells = rng.integers(0, 2**27, m)
        deltas = rng.integers(-(10**6), 10**6, m)
        cells[0], deltas[-1] = 0, -1
        packed = counting_math.pack_ops(cells, deltas)
        assert packed == b" ".join(
            b"#%d %d" % (c, d) for c, d in zip(cells.tolist(), deltas.tolist(), strict=True)
        )
        back = counting_math.unpack_ops(packed)
        assert np.array_equal(back[0], cells) and np.array_equal(back[1], deltas)
        bounds = np.r_[0, np.sort(rng.integers(0, m + 1, 3)), m]
        parts = counting_math.pack_ops_split(cells, deltas, bounds)
        assert parts == [
            counting_math.pack_ops(cells[lo:hi], deltas[lo:hi])
            for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
        ]
    assert counting_math.pack_ops(np.array([], int), np.array([], int)) == b""


def test_whole_table_addition_saturates_like_bitfield() -> None:
    """``Increments.added_to`` gives what ``BITFIELD ... OVERFLOW SAT INCRBY i32`` gives for
    one summed increment per cell: int32 cells, big-endian, saturated at the bounds."""
    lo, hi = -(2**31), 2**31 - 1
    table = np.array([0, 5, hi - 1, lo + 1, -7, 3], dtype=">i4").tobytes()
    inc = counting_math.Increments(
        cells=np.array([1, 2, 3, 4, 0], dtype=np.int64),
        deltas=np.array([-9, 5, -5, 7, 1], dtype=np.int64),
        bounds=np.array([0, 4, 5]),
    )
    out = np.frombuffer(inc.added_to(0, table), dtype=">i4").tolist()
    assert out == [0, -4, hi, lo, 0, 3]
    assert inc.packed([1]) == [b"#0 1"] and inc.packed() == [b"#1 -9 #2 5 #3 -5 #4 7", b"#0 1"]
