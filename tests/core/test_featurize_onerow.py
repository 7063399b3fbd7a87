"""The one-row featurize path (``Featurizer._transform_few``: value and key caches, new keys
derived in Python floats, ``derived_blocks``, label 1.. only) gives bit for bit what the batch
path gives, on the values a JSON body can hold."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from service.core.features.columns import assemble, derived_blocks, derived_columns
from service.core.features.featurizer import Featurizer
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.tables.aggregate import Aggregate
from service.streams.schemas import StreamCreate

SEED = bytes(range(32))
# Categorical values: empty, unicode, numbers that canonicalise like strings ("196", 196,
# 196.0), booleans next to the numbers they equal, a number past float precision, NaN.
CATEGORIES: list[object] = ["", "a", "é", "\u2603", "196", 196, 196.0, "true", True, 1, 1.0]
CATEGORIES += [False, 0, -0.0, 2.5, -3, 10**30, "x" * 60, None]
# Numeric values (bucketed, and passed through): ints, floats, bounds, booleans, strings.
NUMBERS: list[object] = [None, 0, -0.0, 17.5, 18, 18.0, 24.99, 25, 99, -1e300, 1e300, 10**30]
NUMBERS += [True, False, 3]


def runtime(labels: Sequence[str], pairs: bool) -> StreamRuntime:
    cfg = StreamCreate.model_validate(
        {
            "name": "s",
            "features": [
                {"name": "user", "kind": "categorical"},
                {"name": "item", "kind": "categorical"},
                {"name": "age", "kind": "numeric", "buckets": [18, 25, 35], "passthrough": True},
                {"name": "n", "kind": "numeric", "buckets": [0], "passthrough": True},
            ],
            "labels": list(labels),
            "privacy": {"mechanism": "laplace", "epsilon": 1.0},
            "sketch": {"width": 64, "depth": 5},
        }
    )
    tables = [(1, "user", ("user",)), (2, "item", ("item",)), (3, "age", ("age",))]
    if pairs:
        tables.insert(1, (4, "user+age", ("user", "age")))
    refs = tuple(TableRef(tid, name, feats, 1) for tid, name, feats in tables)
    return StreamRuntime(id=1, name="s", config=cfg, hash_seed=SEED, tables=refs)


def featurizer(labels: Sequence[str], pairs: bool, seed: int) -> Featurizer:
    rt = runtime(labels, pairs)
    rng = np.random.default_rng(seed)
    layout = [(t.id, rt.spec.cells) for t in rt.tables]
    cells = rng.integers(-40, 90, rt.spec.cells * len(layout) + rt.spec.n_labels)
    return Featurizer.build(rt, Aggregate(5, 1, 2, [1, 2], layout, cells.astype(np.int64)))


def rows_of(rng: np.random.Generator, n: int) -> list[dict[str, object]]:
    rows = []
    for _ in range(n):
        row: dict[str, object] = {}
        for name, pool in (("user", CATEGORIES), ("item", CATEGORIES), ("age", NUMBERS)):
            if rng.random() < 0.85:  # else missing
                row[name] = pool[int(rng.integers(0, len(pool)))]
        if rng.random() < 0.7:
            row["n"] = NUMBERS[int(rng.integers(0, len(NUMBERS)))]
        rows.append(row)
    return rows


@pytest.mark.parametrize("labels", [["0", "1"], ["a", "b", "c"]])
@pytest.mark.parametrize("pairs", [False, True])
def test_one_row_equals_the_batch_on_every_json_value(labels: list[str], pairs: bool) -> None:
    """Each row alone, first with its keys new, then again with every value cached, against
    the batch of all rows (numpy hashing, estimates and derived columns)."""
    rng = np.random.default_rng(len(labels) + 10 * pairs)
    rows = rows_of(rng, 300)
    rows += [{}, {"user": "unseen-value", "n": 5}, {"user": True}, {"user": 1}, {"user": "1"}]
    want = featurizer(labels, pairs, 4).transform(rows)
    fz = featurizer(labels, pairs, 4)
    for _ in range(2):
        got = np.vstack([fz.transform([row]) for row in rows])
        assert got.tobytes() == want.tobytes()
    assert fz.derived_cache is not None and any(fz.derived_cache.by_key)  # the cache was used


def test_unhashable_and_boolean_values_take_the_slow_way() -> None:
    """A list (validation forbids it) and booleans are never looked up in a value cache."""
    fz = featurizer(["0", "1"], False, 5)
    fresh = featurizer(["0", "1"], False, 5)
    for value in (1, True, 1.0, ["x"], 0, False, "true", {"a": 1}):
        row = {"user": value, "item": value, "age": 20}
        got = fz.transform([row])
        want = fresh.transform([row] * 9)[:1]  # the batch path
        assert got.tobytes() == want.tobytes(), value


def test_passthrough_values_as_the_batch_gives_them() -> None:
    fz = featurizer(["0", "1"], False, 6)
    values: list[object] = [None, 0, -0.0, 7, 2.5, 10**30, -1e300, True, False, "7"]
    for age in values:  # "age" is a table's feature too; "n" only passed through
        for n in [*values, [1]]:
            row = {"age": age, "n": n}
            got = fz.transform([row])
            want = fz.transform([row] * 9)[:1]
            assert got.tobytes() == want.tobytes(), (age, n)
            assert math.isnan(got[0, -1]) == (n is None or n.__class__ not in (int, float))


@pytest.mark.parametrize("n_labels", [2, 3, 5])
def test_derived_blocks_equal_derived_columns(n_labels: int) -> None:
    """``derived_blocks`` against ``derived_columns`` + ``assemble``, backed-off keys (the
    prior's p) included."""
    rng = np.random.default_rng(n_labels)
    prior = rng.dirichlet(np.ones(n_labels))
    for round_ in range(30):
        k = int(rng.integers(1, 12))
        estimates = rng.integers(-5, 30, (k, n_labels)).astype(np.float64)
        estimates += 0.5 * rng.integers(0, 2, (k, n_labels))
        thresholds = rng.choice([0.0, 10.0, 1e9], size=k)
        want = assemble(
            [derived_columns(estimates, prior=prior, alpha=1.0, threshold=thresholds)], [], k
        )
        kw = {"prior": prior.tolist(), "alpha": 1.0, "thresholds": thresholds.tolist()}
        got = derived_blocks(estimates.tolist(), **kw)  # type: ignore[arg-type]
        assert got == [want[i].tobytes() for i in range(k)], round_
