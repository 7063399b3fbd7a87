"""The in-memory Featurizer (distinct keys hashed once, one gather for all tables, one take per
block of rows) gives bit for bit what featurizing row by row, table by table gives."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pytest

from service.core.features.columns import (
    FeatureSpec,
    assemble,
    canonical_value,
    combine_codes,
    derived_columns,
    encode_column,
    passthrough_values,
    row_keys,
    table_keys,
)
from service.core.features.featurizer import Featurizer
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.tables.aggregate import Aggregate
from service.core.tables.sketch import estimate, hash_keys
from service.streams.schemas import StreamCreate
from tests.conftest import Api, unique
from tests.helpers import obs, stream_body

SEED = bytes(range(32))


def runtime(
    tables: Sequence[tuple[int, str, tuple[str, ...]]], weights: dict[str, float] | None = None
) -> StreamRuntime:
    cfg = StreamCreate.model_validate(
        {
            "name": "s",
            "features": [
                {"name": "user", "kind": "categorical"},
                {"name": "item", "kind": "categorical"},
                {"name": "age", "kind": "numeric", "buckets": [18, 25, 35], "passthrough": True},
            ],
            "labels": ["0", "1", "2"],
            "privacy": {"mechanism": "laplace", "epsilon": 1.0, "table_weights": weights or {}},
            "sketch": {"width": 64, "depth": 4},
        }
    )
    refs = tuple(TableRef(tid, name, feats, 1) for tid, name, feats in tables)
    return StreamRuntime(id=1, name="s", config=cfg, hash_seed=SEED, tables=refs)


def aggregate(rt: StreamRuntime, table_ids: Sequence[int], rng: np.random.Generator) -> Aggregate:
    layout = [(tid, rt.spec.cells) for tid in table_ids]
    cells = rng.integers(-20, 60, rt.spec.cells * len(table_ids) + rt.spec.n_labels)
    kwargs = {f.name for f in dataclasses.fields(Aggregate)}
    assert "layout" in kwargs
    return Aggregate(5, 1, 2, [1, 2], layout, cells.astype(np.int64))


def reference(fz: Featurizer, rows: Sequence[Mapping[str, object]]) -> np.ndarray:
    """The original algorithm: every row, every table, one estimate per row."""
    rt = fz.rt
    values = row_keys(rows, rt.features)
    per_table = []
    for j, t in enumerate(rt.tables):
        cells = fz.agg.tables.get(t.id)
        if cells is None:
            cells = np.zeros(rt.spec.cells, np.int64)
        buckets, signs = hash_keys(
            table_keys(values, t.features), seed=rt.hash_seed, table=t.name, spec=rt.spec
        )
        est = estimate(cells, buckets, signs, rt.spec)
        per_table.append(
            derived_columns(
                est,
                prior=fz.prior,
                alpha=rt.config.featurize.alpha,
                threshold=float(fz.thresholds[j]),
            )
        )

    def num(v: object) -> float:
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan

    raw = [np.array([num(r.get(f)) for r in rows], dtype=np.float64) for f in rt.passthrough]
    return assemble(per_table, raw, len(rows))


VALUES = ["a", "b", "196", 196, 196.0, True, 1, 1.0, False, 0, None, "", "é", 2.5, -3]
AGES = [None, 0, 17.5, 18, 18.0, 24.99, 25, 35, 99, -1e300, 1e300, 30]


def random_rows(rng: np.random.Generator, n: int) -> list[dict[str, object]]:
    rows = []
    for _ in range(n):
        row: dict[str, object] = {}
        for name, pool in (("user", VALUES), ("item", VALUES), ("age", AGES)):
            if rng.random() < 0.9:  # else the feature is absent: null
                row[name] = pool[int(rng.integers(0, len(pool)))]
        rows.append(row)
    return rows


@pytest.mark.parametrize("n", [0, 1, 5, 63, 64, 300])  # both sides of VECTORISE_FROM
def test_transform_equals_the_row_by_row_reference(n: int) -> None:
    rng = np.random.default_rng(n)
    rt = runtime(
        [
            (1, "user", ("user",)),
            (2, "item", ("item",)),
            (3, "age", ("age",)),
            (4, "user+item", ("user", "item")),
            (5, "user+age+item", ("user", "age", "item")),
        ]
    )
    agg = aggregate(rt, [1, 2, 3, 4], rng)  # table 5 was added after: it reads as zeros
    fz = Featurizer.build(rt, agg)
    rows = random_rows(rng, n)
    got = fz.transform(rows)
    want = reference(fz, rows)
    assert got.shape == want.shape == (n, len(fz.columns))
    assert np.array_equal(got, want, equal_nan=True)
    columns = {f: [r.get(f) for r in rows] for f in ("user", "item", "age")}
    assert np.array_equal(fz.transform_columns(columns, n), want, equal_nan=True)
    as_arrays = {f: np.array(v, dtype=object) for f, v in columns.items()}
    assert np.array_equal(fz.transform_columns(as_arrays, n), want, equal_nan=True)


def test_transform_uses_the_aggregate_without_copying_it() -> None:
    rt = runtime([(1, "user", ("user",)), (2, "age", ("age",))])
    agg = aggregate(rt, [1, 2], np.random.default_rng(0))
    fz = Featurizer.build(rt, agg)
    assert fz.cells is agg.cells
    assert fz.offsets.tolist() == [0, rt.spec.cells]
    # A table the aggregate lacks: a copy with zeros, reused while the tables stay the same.
    rt3 = runtime([(1, "user", ("user",)), (2, "age", ("age",)), (3, "item", ("item",))])
    fz3 = Featurizer.build(rt3, agg)
    assert fz3.cells is not agg.cells and not fz3.cells[2 * rt.spec.cells :].any()
    assert Featurizer.build(rt3, agg, previous=fz3).cells is fz3.cells
    assert Featurizer.build(rt, agg, previous=fz3).cells is agg.cells


@pytest.mark.parametrize("n", [3, 200])
def test_encode_column_keys_are_the_canonical_values(n: int) -> None:
    rng = np.random.default_rng(1)
    cat = FeatureSpec("c", "categorical")
    num = FeatureSpec("x", "numeric", (18.0, 25.0, 35.0))
    for spec, pool in ((cat, VALUES), (num, AGES + [True, False, "24", 7])):
        values = [pool[int(i)] for i in rng.integers(0, len(pool), n)]
        enc = encode_column(values, spec)
        assert enc.codes.dtype == np.int64 and enc.codes.shape == (n,)
        assert [enc.keys[c] for c in enc.codes.tolist()] == [
            canonical_value(v, spec) for v in values
        ]


def test_encode_column_keeps_booleans_apart_from_the_numbers_they_equal() -> None:
    """True == 1 as a dict key, but a categorical true is b"true" and 1 is b"1" whichever comes
    first in a batch (row_keys used to give both the first one's key)."""
    spec = FeatureSpec("c", "categorical")
    for values in ([True, 1, 1.0, False, 0], [1, True, 0, False], [0.0, False]):
        want = [canonical_value(v, spec) for v in values]
        enc = encode_column(values, spec)
        assert [enc.keys[c] for c in enc.codes.tolist()] == want
        assert row_keys([{"c": v} for v in values], [spec])["c"] == want


def test_encode_numeric_bad_values_fail_as_before() -> None:
    spec = FeatureSpec("x", "numeric", (1.0,))
    for bad in ("abc", 10**400):
        values = [1.0] * 100 + [bad]
        with pytest.raises((ValueError, OverflowError)):
            encode_column(values, spec)


def test_combine_codes_matches_table_keys() -> None:
    rng = np.random.default_rng(2)
    specs = [FeatureSpec("a", "categorical"), FeatureSpec("b", "numeric", (0.0, 1.0))]
    rows = [
        {"a": VALUES[int(rng.integers(0, len(VALUES)))], "b": AGES[int(rng.integers(0, 12))]}
        for _ in range(100)
    ]
    enc = combine_codes([encode_column([r.get(s.name) for r in rows], s) for s in specs])
    want = table_keys(row_keys(rows, specs), ["a", "b"])
    assert [enc.keys[c] for c in enc.codes.tolist()] == want


def test_passthrough_values_as_before() -> None:
    for n in (3, 100):
        values = ([1, 2.5, None, True, "7", -0.0] * n)[: 2 * n]
        got = passthrough_values(values)
        want = [float(v) if type(v) in (int, float) else math.nan for v in values]
        assert np.array_equal(got, np.array(want), equal_nan=True)


async def test_train_batches_read_ahead_equal_featurize_and_stop_cleanly(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks read as one string each (and one ahead) give the rows in order, featurized
    exactly as featurize does; a consumer that stops early leaves nothing pending."""
    from service.features import service as features

    monkeypatch.setattr(features, "TRAINSET_CHUNK", 7)
    name = unique("chunks")
    body = stream_body(name, hot_windows=2)
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    rows = [obs(f"u{i % 5}", f"i{i % 3}", i % 70, str(i % 2), f"r{i}") for i in range(30)]
    rows[3]["features"]["item"] = None
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": rows}
    )
    assert r.status_code == 202
    fz = await features.featurizer(ctx=api.ctx, name=name)
    batches = [b async for b in features.train_batches(api.ctx, fz)]
    assert [b.num_rows for b in batches] == [7, 7, 7, 7, 2]
    table = pa.Table.from_batches(batches)
    assert table.column("id").to_pylist() == [f"r{i}" for i in range(30)]
    got = np.column_stack([table.column(c).to_numpy() for c in fz.columns])
    want = fz.transform([o["features"] for o in rows])
    assert np.array_equal(got, want, equal_nan=True)

    gen = features.train_batches(api.ctx, fz)
    first = await gen.__anext__()
    assert first.num_rows == 7
    ahead = [t for t in asyncio.all_tasks() if "hot_chunk" in repr(t.get_coro())]
    assert len(ahead) <= 1  # the read-ahead of the second chunk (unless already done)
    await gen.aclose()  # cancels it
    if ahead:
        done, pending = await asyncio.wait(ahead, timeout=10)
        assert not pending and all(t.cancelled() or t.exception() is None for t in done)


async def test_hot_chunk_reads_rows_as_one_string(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.stores import windows

    monkeypatch.setattr(windows, "HOT_STEP", 2)  # a chunk read in several steps
    store = api.ctx.stores.windows
    name = unique("chunk")
    key = api.ctx.keys.hot(name, 1)
    assert await store.hot_chunk(name, 1, "-", "+", 10) is None
    ids = [await api.ctx.redis.xadd(key, {"d": b'{"i":%d}' % i}) for i in range(5)]
    last, n, rows = await store.hot_chunk(name, 1, "-", ids[-1], 3)  # type: ignore[misc]
    assert (last, n, rows) == (ids[2], 3, b'{"i":0},{"i":1},{"i":2}')
    last, n, rows = await store.hot_chunk(name, 1, b"(" + last, ids[-1], 3)  # type: ignore[misc]
    assert (last, n, rows) == (ids[4], 2, b'{"i":3},{"i":4}')
    await api.ctx.redis.xadd(key, {"x": b"1"})
    with pytest.raises(RuntimeError, match="no d field"):
        await store.hot_chunk(name, 1, "-", "+", 10)
    await api.ctx.redis.delete(key)


def test_each_table_backs_off_below_its_own_noise() -> None:
    """With a budget split, a table's back-off threshold follows its own noise: the heavily
    weighted table (less noise) keeps counts that the others treat as noise."""
    from service.core.features.columns import backoff_threshold

    tables = [(1, "user", ("user",)), (2, "item", ("item",)), (3, "user+item", ("user", "item"))]
    rt = runtime(tables, weights={"item": 10.0})
    rng = np.random.default_rng(3)
    agg = aggregate(rt, [1, 2, 3], rng)
    fz = Featurizer.build(rt, agg)
    for j, t in enumerate(rt.tables):
        want = backoff_threshold(
            noise_variance=rt.noise.variance_for(rt.weight_of(t)),
            n_windows=agg.n_windows,
            n_labels=3,
            sigmas=1.0,
        )
        assert fz.thresholds[j] == pytest.approx(want)
    assert rt.weight_of(rt.tables[2]) == 1.0  # a selected group: weight 1
    assert fz.thresholds[1] < fz.thresholds[0] / 5  # b ratio 10 → threshold ratio ~10
    rows = [{"user": "a", "item": "b"}] * 3
    assert np.array_equal(fz.transform(rows), reference(fz, rows), equal_nan=True)
