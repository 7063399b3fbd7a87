"""The batch forms of the sketch core used by the hot paths (KeyHasher, estimate_stacked,
grouped_increments) give exactly what the one-table functions give: the hash construction and
the sketch arithmetic stay those pinned in test_sketch.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.tables.sketch import (
    KeyHasher,
    SketchSpec,
    aggregate_increments,
    estimate,
    estimate_stacked,
    grouped_increments,
    hash_keys,
)

SEED = bytes(range(16))


def test_key_hasher_equals_hash_keys_per_table() -> None:
    spec = SketchSpec(1024, 4, 1)
    groups = [
        ("t", [b"hello", b"world"]),
        ("age|zip", [b"", b"a", "é".encode()]),
        ("t", [b"hello"]),
        ("empty", []),
    ]
    buckets, signs = KeyHasher(seed=b"seed", spec=spec).hash_many(groups)
    ref = [hash_keys(keys, seed=b"seed", table=t, spec=spec) for t, keys in groups if keys]
    assert np.array_equal(buckets, np.concatenate([b for b, _ in ref]))
    assert np.array_equal(signs, np.concatenate([s for _, s in ref]))
    assert buckets.dtype == np.int64 and signs.dtype == np.int8
    # The golden values of test_hash_golden_values, through the batch path.
    assert buckets[:2].tolist() == [[334, 416, 557, 969], [477, 232, 496, 920]]
    assert signs[:2].tolist() == [[-1, -1, 1, -1], [1, 1, -1, -1]]


def test_key_hasher_validation_and_empty() -> None:
    spec = SketchSpec(8, 2, 1)
    with pytest.raises(ValueError, match="seed must be bytes"):
        KeyHasher(seed="s", spec=spec)  # type: ignore[arg-type]
    hasher = KeyHasher(seed=SEED, spec=spec)
    with pytest.raises(ValueError, match="keys must be bytes"):
        hasher.hash_many([("t", ["k"])])  # type: ignore[list-item]
    b, s = hasher.hash_many([])
    assert b.shape == s.shape == (0, 2)


def test_estimate_stacked_equals_estimate_per_table() -> None:
    rng = np.random.default_rng(3)
    for spec in (SketchSpec(64, 5, 2), SketchSpec(32, 4, 3)):  # odd and even depth
        n_tables = 4
        cells = rng.integers(-50, 50, n_tables * spec.cells).astype(np.int64)
        table = rng.integers(0, n_tables, 200)
        keys = [b"k%d" % i for i in rng.integers(0, 60, 200)]
        buckets, signs = hash_keys(keys, seed=SEED, table="t", spec=spec)
        got = estimate_stacked(cells, table * spec.cells, buckets, signs, spec)
        for j in range(200):
            part = cells[table[j] * spec.cells : (table[j] + 1) * spec.cells]
            want = estimate(part, buckets[j : j + 1], signs[j : j + 1], spec)
            assert np.array_equal(got[j : j + 1], want)
        assert got.dtype == np.float64


def test_estimate_stacked_validation() -> None:
    spec = SketchSpec(8, 2, 1)
    cells = np.zeros(2 * spec.cells, np.int64)
    b, s = np.array([[0, 1]]), np.array([[1, -1]], np.int8)
    with pytest.raises(ValueError, match="whole tables"):
        estimate_stacked(cells, np.array([spec.cells + 1]), b, s, spec)
    with pytest.raises(ValueError, match="offsets must have shape"):
        estimate_stacked(cells, np.array([0, 0]), b, s, spec)
    with pytest.raises(ValueError, match="flat integer"):
        estimate_stacked(cells.astype(float), np.array([0]), b, s, spec)
    assert estimate_stacked(cells, np.zeros(0, np.int64), b[:0], s[:0], spec).shape == (0, 1)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 400),
    n_keys=st.integers(1, 30),
    n_labels=st.integers(1, 3),
    width=st.sampled_from([2, 16, 4096]),
    depth=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
)
def test_grouped_increments_equal_aggregate_increments(
    n: int, n_keys: int, n_labels: int, width: int, depth: int, seed: int
) -> None:
    spec = SketchSpec(width, depth, n_labels)
    rng = np.random.default_rng(seed)
    keys = [b"k%d" % i for i in range(n_keys)]
    buckets, signs = hash_keys(keys, seed=SEED, table="t", spec=spec)
    codes = rng.integers(0, n_keys, n)
    labels = rng.integers(0, n_labels, n)
    got = grouped_increments(labels, codes, buckets, signs, spec)
    want = aggregate_increments(labels, buckets[codes], signs[codes], spec)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert got[0].dtype == got[1].dtype == np.int64


def test_grouped_increments_stack_tables_as_labels() -> None:
    """Several tables in one call: table t's cells come out at t * cells + cell."""
    spec = SketchSpec(256, 3, 2)
    rng = np.random.default_rng(5)
    n = 500
    labels = rng.integers(0, 2, n)
    per_table = []
    for t in ("a", "b", "c"):
        keys = [b"v%d" % i for i in range(40)]
        b, s = hash_keys(keys, seed=SEED, table=t, spec=spec)
        per_table.append((rng.integers(0, 40, n), b, s))
    stacked = SketchSpec(256, 3, 2 * 3)
    idx, deltas = grouped_increments(
        np.concatenate([labels + 2 * j for j in range(3)]),
        np.concatenate([c + 40 * j for j, (c, _, _) in enumerate(per_table)]),
        np.concatenate([b for _, b, _ in per_table]),
        np.concatenate([s for _, _, s in per_table]),
        stacked,
    )
    for j, (c, b, s) in enumerate(per_table):
        mine = (idx >= j * spec.cells) & (idx < (j + 1) * spec.cells)
        want = aggregate_increments(labels, b[c], s[c], spec)
        assert np.array_equal(idx[mine] - j * spec.cells, want[0])
        assert np.array_equal(deltas[mine], want[1])


def test_grouped_increments_huge_spec_takes_the_argsort_path() -> None:
    """cells * (2 * count + 1) past 2**62: (cell, delta) no longer packs into one int64."""
    spec = SketchSpec(2**24, 16, 2**20)
    keys = [b"x", b"y"]
    buckets, signs = hash_keys(keys, seed=SEED, table="t", spec=spec)
    codes = np.array([0] * 10_000 + [1] * 3)
    labels = np.array([2**20 - 1] * 10_000 + [0] * 3)
    got = grouped_increments(labels, codes, buckets, signs, spec)
    want = aggregate_increments(labels, buckets[codes], signs[codes], spec)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert sorted(set(np.abs(got[1]).tolist())) == [3, 10_000]


def test_grouped_increments_validation() -> None:
    spec = SketchSpec(8, 2, 2)
    b, s = np.array([[0, 1]]), np.array([[1, -1]], np.int8)
    with pytest.raises(ValueError, match="codes must be in"):
        grouped_increments(np.array([0]), np.array([1]), b, s, spec)
    with pytest.raises(ValueError, match="labels must be in"):
        grouped_increments(np.array([2]), np.array([0]), b, s, spec)
    with pytest.raises(ValueError, match="one length"):
        grouped_increments(np.array([0, 1]), np.array([0]), b, s, spec)
    idx, deltas = grouped_increments(np.array([], int), np.array([], int), b, s, spec)
    assert idx.shape == deltas.shape == (0,)
