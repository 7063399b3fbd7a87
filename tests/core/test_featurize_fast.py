"""The fast paths of featurization give bit for bit what the paths they replaced gave: the
column encoding (``encode_column``, against its previous implementation kept here), the key
block take of a big batch, the Python-float derived columns of a few keys (``derived_blocks``
against ``derived_columns``), the raw-value cache of one-row requests, and the JSON answer
(NaN written as null by orjson against NaN turned into None first)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import orjson
import pytest

from service.core.features import featurizer as featurizer_module
from service.core.features.columns import (
    Encoded,
    FeatureSpec,
    _distinct_codes,
    assemble,
    canonical_value,
    derived_blocks,
    derived_columns,
    encode_column,
)
from service.core.features.featurizer import Featurizer
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.tables.aggregate import Aggregate
from service.features.service import featurize_json
from service.streams.schemas import StreamCreate

SEED = bytes(range(32))
STRINGS = ["a", "b", "", "é", "196", "x" * 40, "\u2603", "nan", "true"]
MIXED = STRINGS + [None, 196, 196.0, True, 1, 1.0, False, 0, -0.0, 2.5, -3, 10**30, math.nan]
NUMBERS = [None, 0, 17.5, 18, 18.0, 24.99, 25, 35, 99, -1e300, 1e300, True, False, -0.0]


def previous_encode_column(values: Sequence[object], spec: FeatureSpec) -> Encoded:
    """``encode_column`` as it was before its fast path (its numeric branch is unchanged and
    shared)."""
    from service.core.features.columns import VECTORISE_FROM, _encode_numeric

    n = len(values)
    if isinstance(values, np.ndarray) and values.dtype == object:
        values = values.tolist()
    if spec.kind == "numeric" and n >= VECTORISE_FROM:
        fast = _encode_numeric(values, spec)
        if fast is not None:
            return fast
    try:
        codes, distinct = _distinct_codes(values, tagged=False)
        if spec.kind != "numeric" and all(u.__class__ is str for u in distinct):
            keys = [u.encode() for u in distinct]  # type: ignore[attr-defined]
            return Encoded(np.asarray(codes, dtype=np.int64).reshape(n), keys)
        if spec.kind != "numeric" and any(
            u.__class__ is bool or (u.__class__ in (int, float) and (u == 0 or u == 1))
            for u in distinct
        ):
            codes, distinct = _distinct_codes(values, tagged=True)
    except TypeError:
        memo: dict[bytes, int] = {}
        codes = [memo.setdefault(canonical_value(v, spec), len(memo)) for v in values]
        return Encoded(np.asarray(codes, dtype=np.int64).reshape(n), list(memo))
    keys = [canonical_value(v, spec) for v in distinct]
    return Encoded(np.asarray(codes, dtype=np.int64).reshape(n), keys)


@pytest.mark.parametrize("n", [0, 1, 5, 63, 64, 300, 3000])
@pytest.mark.parametrize("pool", ["strings", "strings+null", "mixed", "numbers"])
def test_encode_column_equals_its_previous_implementation(n: int, pool: str) -> None:
    rng = np.random.default_rng([n, len(pool)])
    values_pool = {
        "strings": STRINGS,
        "strings+null": STRINGS + [None],
        "mixed": MIXED,
        "numbers": NUMBERS,
    }[pool]
    specs = [FeatureSpec("c", "categorical"), FeatureSpec("x", "numeric", (18.0, 25.0, 35.0))]
    for spec in specs:
        if spec.kind == "numeric" and pool != "numbers":
            continue  # (strings in a numeric column fail in both, tested below)
        values = [values_pool[int(i)] for i in rng.integers(0, len(values_pool), n)]
        for given in (values, np.array(values + [0], dtype=object)[:n]):
            got, want = encode_column(given, spec), previous_encode_column(given, spec)
            assert got.codes.dtype == np.int64 and got.codes.shape == (n,)
            assert np.array_equal(got.codes, want.codes) and got.keys == want.keys
            assert [got.keys[c] for c in got.codes.tolist()] == [
                canonical_value(v, spec) for v in values
            ]


def test_encode_column_unhashable_and_bad_values_as_before() -> None:
    cat = FeatureSpec("c", "categorical")
    values: list[object] = ["a", ["x"], "a", None, ["x"]]
    got, want = encode_column(values, cat), previous_encode_column(values, cat)
    assert np.array_equal(got.codes, want.codes) and got.keys == want.keys
    num = FeatureSpec("x", "numeric", (1.0,))
    for bad in ("abc", 10**400):
        with pytest.raises((ValueError, OverflowError)):
            encode_column([1.0, bad], num)


def runtime(labels: Sequence[str], *, passthrough: bool = True) -> StreamRuntime:
    cfg = StreamCreate.model_validate(
        {
            "name": "s",
            "features": [
                {"name": "user", "kind": "categorical"},
                {"name": "item", "kind": "categorical"},
                {
                    "name": "age",
                    "kind": "numeric",
                    "buckets": [18, 25, 35],
                    "passthrough": passthrough,
                },
            ],
            "labels": list(labels),
            "privacy": {"mechanism": "laplace", "epsilon": 1.0},
            "sketch": {"width": 64, "depth": 4},
        }
    )
    tables = [
        (1, "user", ("user",)),
        (2, "item", ("item",)),
        (3, "age", ("age",)),
        (4, "user+item", ("user", "item")),
    ]
    refs = tuple(TableRef(tid, name, feats, 1) for tid, name, feats in tables)
    return StreamRuntime(id=1, name="s", config=cfg, hash_seed=SEED, tables=refs)


def featurizer(labels: Sequence[str], seed: int, *, passthrough: bool = True) -> Featurizer:
    rt = runtime(labels, passthrough=passthrough)
    rng = np.random.default_rng(seed)
    layout = [(t.id, rt.spec.cells) for t in rt.tables]
    cells = rng.integers(-20, 60, rt.spec.cells * len(layout) + rt.spec.n_labels)
    assert "layout" in {f.name for f in dataclasses.fields(Aggregate)}
    return Featurizer.build(rt, Aggregate(5, 1, 2, [1, 2], layout, cells.astype(np.int64)))


def rows_of(rng: np.random.Generator, n: int) -> list[dict[str, object]]:
    out = []
    for _ in range(n):
        row: dict[str, object] = {}
        for name, pool in (("user", MIXED[:-1]), ("item", STRINGS + [None]), ("age", NUMBERS)):
            if rng.random() < 0.9:
                row[name] = pool[int(rng.integers(0, len(pool)))]
        out.append(row)
    return out


@pytest.mark.parametrize("labels", [["0", "1"], ["0", "1", "2"], ["a", "b", "c", "d", "e"]])
@pytest.mark.parametrize("passthrough", [True, False])
def test_batch_one_row_and_few_rows_agree_bit_for_bit(
    labels: list[str], passthrough: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch (key blocks taken as opaque items, several row blocks), the by-column
    batch, and the few-row path (value cache, key cache, Python-float derivation) on the same
    rows, each row alone and again once every value is cached."""
    monkeypatch.setattr(featurizer_module, "ROW_BLOCK", 7)
    monkeypatch.setattr(featurizer_module, "PLAIN_PAGES_FROM", 0)  # outputs from calloc
    rng = np.random.default_rng(len(labels))
    fz = featurizer(labels, 1, passthrough=passthrough)
    rows = rows_of(rng, 200)
    batch = fz.transform(rows)
    assert batch.shape == (200, len(fz.columns)) and batch.flags.c_contiguous
    assert batch.flags.writeable and batch.dtype == np.float64
    columns = {f: [r.get(f) for r in rows] for f in ("user", "item", "age")}
    encoded, raw = fz.encode_columns(columns, len(rows))
    by_column = fz.transform_encoded(encoded, raw, len(rows), by_column=True)
    assert np.array_equal(by_column.T, batch, equal_nan=True)
    for _ in range(2):  # cold caches, then every value and key cached
        one = np.vstack([fz.transform([r]) for r in rows])
        assert np.array_equal(one, batch, equal_nan=True)
        few = np.vstack([fz.transform(rows[i : i + 8]) for i in range(0, len(rows), 8)])
        assert np.array_equal(few, batch, equal_nan=True)
    assert fz.derived_cache is not None and any(fz.derived_cache.by_value)
    out = fz.transform([rows[0]])
    assert out.flags.c_contiguous and out.flags.writeable and out.dtype == np.float64


def test_value_cache_keeps_booleans_and_unhashables_apart() -> None:
    """True == 1 as a dict key: a categorical true must not be answered from 1's block."""
    fz = featurizer(["0", "1"], 2)
    fresh = featurizer(["0", "1"], 2)
    for value in (1, True, 1.0, False, 0, -0.0, "1", "true", ["x"], 196, "196"):
        got = fz.transform([{"user": value}])  # after every earlier value
        want = fresh.transform_columns({"user": [value] * 9}, 9)[:1]  # the batch path
        assert np.array_equal(got, want, equal_nan=True), value


def test_caches_stay_bounded_and_answers_do_not_change(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(featurizer_module, "FEW_CACHE_KEYS", 40)
    fz = featurizer(["0", "1"], 3)
    rows = [{"user": f"u{i}", "item": f"i{i % 7}", "age": i} for i in range(300)]
    want = fz.transform(rows)
    got = np.vstack([fz.transform([r]) for r in rows])
    assert np.array_equal(got, want, equal_nan=True)
    cache = fz.derived_cache
    assert cache is not None
    assert sum(len(c) for c in cache.by_key) == cache.held <= 40
    assert all(len(c) <= cache.values_per_table for c in cache.by_value)
    assert len(cache.by_key[1]) == 7  # the few-valued table was not dropped


@pytest.mark.parametrize("n_labels", [2, 3, 4, 9])
def test_derived_blocks_equal_derived_columns(n_labels: int) -> None:
    rng = np.random.default_rng(n_labels)
    k = 500
    ints = rng.integers(-(10**6), 10**6, (k, n_labels)).astype(np.float64)
    small = rng.integers(-5, 5, (k, n_labels)).astype(np.float64)
    halves = small + 0.5 * rng.integers(0, 2, (k, n_labels))
    estimates = np.vstack([ints, small, halves, np.zeros((3, n_labels)), [[2.0**60] * n_labels]])
    prior = rng.dirichlet(np.ones(n_labels))
    for alpha in (1.0, 0.3, 25.0):
        thresholds = rng.choice([0.0, 3.0, 1e9, 7.5], size=estimates.shape[0])
        want = assemble(
            [derived_columns(estimates, prior=prior, alpha=alpha, threshold=thresholds)],
            [],
            estimates.shape[0],
        )
        got = derived_blocks(
            estimates.tolist(), prior=prior.tolist(), alpha=alpha, thresholds=thresholds.tolist()
        )
        assert got == [want[i].tobytes() for i in range(estimates.shape[0])]


def test_featurize_json_writes_nan_as_null_as_before() -> None:
    rng = np.random.default_rng(5)
    matrix = rng.standard_normal((6, 30)) * 10.0 ** rng.integers(-300, 300, (6, 30))
    matrix[rng.random((6, 30)) < 0.3] = np.nan
    matrix[0, :4] = [0.0, -0.0, 5e-324, 1e308]
    out = {"epoch": 3, "columns": [f"c{i}" for i in range(30)], "rows": matrix}
    nan = np.isnan(matrix)
    before = orjson.dumps(
        {**out, "rows": np.where(nan, None, matrix).tolist()}, option=orjson.OPT_SERIALIZE_NUMPY
    )
    assert featurize_json(out) == before
    assert featurize_json({**out, "rows": matrix[:, ::2]}) == orjson.dumps(
        {**out, "rows": np.where(nan[:, ::2], None, matrix[:, ::2]).tolist()}
    )
