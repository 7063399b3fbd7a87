"""The counting job's faster paths give exactly what the plain ones give: pairs counted by
bincount per table block (``grouped_increments(label_block=...)``) and the digest cache of the
counting job's ``KeyHasher`` (issue 17)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.tables.sketch import (
    KeyHasher,
    SketchSpec,
    aggregate_increments,
    grouped_increments,
)

SEED = bytes(range(16))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    n_tables=st.integers(1, 5),
    n_labels=st.integers(1, 3),
    n_keys=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_label_block_equals_the_sorted_path(
    n: int, n_tables: int, n_labels: int, n_keys: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    spec = SketchSpec(64, 3, n_tables * n_labels)
    hasher = KeyHasher(seed=SEED, spec=spec)
    groups = [(f"t{j}", [b"v%d" % i for i in range(n_keys)]) for j in range(n_tables)]
    buckets, signs = hasher.hash_many(groups)
    y = rng.integers(0, n_labels, n)
    labels = np.concatenate([y + j * n_labels for j in range(n_tables)])
    codes = np.concatenate([rng.integers(0, n_keys, n) + j * n_keys for j in range(n_tables)])
    fast = grouped_increments(labels, codes, buckets, signs, spec, label_block=n_labels)
    plain = grouped_increments(labels, codes, buckets, signs, spec)
    want = aggregate_increments(labels, buckets[codes], signs[codes], spec)
    for got in (fast, plain):
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        assert got[0].dtype == got[1].dtype == np.int64


def test_label_block_refuses_a_key_in_two_blocks() -> None:
    spec = SketchSpec(8, 2, 4)
    b, s = np.array([[0, 1]]), np.array([[1, -1]], np.int8)
    with pytest.raises(ValueError, match="two blocks"):
        grouped_increments(np.array([0, 2]), np.array([0, 0]), b, s, spec, label_block=2)


def test_cached_hasher_gives_the_same_digests_and_stays_bounded() -> None:
    spec = SketchSpec(1024, 4, 2)
    plain = KeyHasher(seed=SEED, spec=spec)
    cached = KeyHasher(seed=SEED, spec=spec, cache_keys=160)  # groups of up to 20 keys cached
    rng = np.random.default_rng(1)
    for _ in range(30):
        groups = [
            (t, [b"k%d" % i for i in np.unique(rng.integers(0, 60, 15)).tolist()])
            for t in ("a", "b", "a+b")
        ]
        groups.append(("big", [b"k%d" % i for i in range(25)]))  # past cache_keys / 8
        want = plain.hash_many(groups)
        got = cached.hash_many(groups)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        held = sum(len(c) for c in cached._digests.values())
        assert 0 < held <= 160
        assert "big" not in cached._digests
    with pytest.raises(ValueError, match="keys must be bytes"):
        cached.hash_many([("a", ["k"])])  # type: ignore[list-item]
