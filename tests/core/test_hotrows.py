"""The train set's vectorised chunk reader (``hotrows.parse_chunk``) gives exactly what parsing
every row with orjson gives (``parse_rows``, and before it ``Featurizer.transform`` on the rows'
feature dicts): same codes' keys, same raw values bit for bit, same id / event_time / label, and
record batches equal to the row-by-row path's on random rows."""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.core.features import hotrows
from service.core.features.columns import FeatureSpec
from service.core.features.featurizer import Featurizer
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.tables.aggregate import Aggregate
from service.counting import service as counting
from service.features import service as features
from service.stores.ingest import IngestStore
from service.streams.schemas import StreamCreate
from tests.conftest import Api, unique
from tests.helpers import stream_body

SEED = bytes(range(32))
LONG = "a_feature_name_longer_than_sixteen_bytes"  # several 8-byte words
EDGES = [-1.5, 0, 18, 25, 35, 1e6]
FEATURES = [
    {"name": "user", "kind": "categorical"},
    {"name": "item", "kind": "categorical"},
    {"name": "id", "kind": "categorical"},  # the same name as a row's own key
    {"name": LONG, "kind": "categorical"},
    {"name": "age", "kind": "numeric", "buckets": EDGES, "passthrough": True},
    {"name": "t", "kind": "numeric", "buckets": [0, 10]},  # bucketised only
    {"name": "count", "kind": "numeric", "buckets": [1, 100], "passthrough": True},
]
TABLES = [
    ("user",),
    ("item",),
    ("id",),
    (LONG,),
    ("age",),
    ("t",),
    ("user", "item"),  # selected group tables
    ("user", "age", "item"),
]

# Categorical values: strings (short, over 8 bytes, unicode, empty, number- and literal-like),
# integers (small, negative, 18+ digits, beyond int64), floats (integral, fractional, huge,
# tiny, -0.0), booleans, null.
CATEGORICAL = [
    "a", "b", "196", "true", "", "é", "日本語の値", "a much longer category value", "0123456789",
    "x" * 8, "y" * 9, 196, 0, 1, -7, 123456789012345678, 1234567890123456789,
    18446744073709551615, -9223372036854775808, 196.0, 1e16, 2.5, -0.0, 0.1, 1e-300,
    1.7976931348623157e308, 12345678901234567890.0, True, False, None,
]  # fmt: skip
NUMERIC = [
    None, 0, -1, 17, 18, 18.0, 24.99, 25, 35, 99, -1.5, -1.50001, 1e6, 999999.9999999999,
    2.5, -0.0, 1e-320, -1e300, 1e300, 123456789012345678, 9007199254740993,
    18446744073709551615, -9223372036854775808, 0.1, 3,
]  # fmt: skip
LABELS = ["0", "1", "2"]


def runtime() -> StreamRuntime:
    cfg = StreamCreate.model_validate(
        {
            "name": "s",
            "features": FEATURES,
            "labels": LABELS,
            "privacy": {"mechanism": "laplace", "epsilon": 1.0},
            "sketch": {"width": 64, "depth": 3},
        }
    )
    refs = tuple(TableRef(i + 1, "+".join(f), f, 1) for i, f in enumerate(TABLES))
    return StreamRuntime(id=1, name="s", config=cfg, hash_seed=SEED, tables=refs)


def featurizer(rng: np.random.Generator) -> Featurizer:
    rt = runtime()
    ids = [t.id for t in rt.tables]
    cells = rng.integers(-5, 40, rt.spec.cells * len(ids) + rt.spec.n_labels).astype(np.int64)
    assert "layout" in {f.name for f in dataclasses.fields(Aggregate)}
    return Featurizer.build(
        rt, Aggregate(5, 1, 2, [1, 2], [(i, rt.spec.cells) for i in ids], cells)
    )


def specs(fz: Featurizer) -> list[FeatureSpec]:
    by_name = {f.name: f for f in fz.rt.features}
    return [by_name[f] for f in fz.encoded_features]


def stored(rows: Sequence[dict[str, object]]) -> bytes:
    """A hot chunk as ``WindowStore.hot_chunk`` returns it: ingest's rows, comma-joined."""
    return b",".join(orjson.dumps(r) for r in rows)


def random_rows(rng: np.random.Generator, n: int) -> list[dict[str, object]]:
    def pick(pool: Sequence[object]) -> object:
        return pool[int(rng.integers(0, len(pool)))]

    rows = []
    for i in range(n):
        f: dict[str, object] = {}
        for spec in FEATURES:
            if rng.random() < 0.85:  # else absent: missing
                f[spec["name"]] = pick(NUMERIC if spec["kind"] == "numeric" else CATEGORICAL)
        if rng.random() < 0.1:
            f["not_a_feature"] = pick(CATEGORICAL)  # unknown names are ignored
        names = list(f)
        order = rng.permutation(len(names))  # clients send features in any order
        rows.append(
            {
                "id": None if rng.random() < 0.1 else f"r{i}",
                "f": {names[j]: f[names[j]] for j in order},
                "y": pick(LABELS),
                "t": None if rng.random() < 0.5 else "2026-11-22T08:00:00+00:00",
            }
        )
    return rows


def assert_same(got: hotrows.Chunk, want: hotrows.Chunk) -> None:
    assert got.n_rows == want.n_rows
    for a, b in ((got.ids, want.ids), (got.times, want.times), (got.labels, want.labels)):
        assert a.type == b.type == pa.string()
        assert a.to_pylist() == b.to_pylist()
    assert list(got.encoded) == list(want.encoded)
    for name, enc in want.encoded.items():
        mine = got.encoded[name]
        assert mine.codes.dtype == np.int64 and mine.codes.shape == (want.n_rows,)
        assert [mine.keys[c] for c in mine.codes.tolist()] == [
            enc.keys[c] for c in enc.codes.tolist()
        ], name
    assert len(got.raw) == len(want.raw)
    for a, b in zip(got.raw, want.raw, strict=True):
        assert a.dtype == b.dtype == np.float64
        assert np.array_equal(a.view(np.int64), b.view(np.int64))  # bit for bit: -0.0, NaN


@pytest.mark.parametrize("n", [1, 2, 9, 300])
def test_scan_equals_orjson_rows_on_random_rows(n: int) -> None:
    rng = np.random.default_rng(n)
    fz = featurizer(rng)
    rows = stored(random_rows(rng, n))
    kw = {"encode": specs(fz), "passthrough": fz.rt.passthrough}
    want = hotrows.parse_rows(rows, **kw)
    assert_same(hotrows._scan(rows, kw["encode"], kw["passthrough"]), want)  # no fallback
    assert_same(hotrows.parse_chunk(rows, **kw), want)


def test_scan_reads_numbers_as_orjson_does() -> None:
    """Numbers by the thousand: integers of every length, and floats as orjson writes them
    (shortest round trip), parse to the same float64 and the same canonical keys."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**63, 3000, dtype=np.int64) * rng.choice([-1, 1], 3000)
    floats = [float(x) for x in bits.view(np.float64) if math.isfinite(x)]
    ints = [int(x) for x in rng.integers(-(2**62), 2**62, 1000)] + [
        int(10 ** int(k)) - 1 for k in rng.integers(0, 20, 200)
    ]
    values: list[object] = floats + ints + [float(x) for x in ints]
    rows = [
        {"id": str(i), "f": {"age": v, "count": v, "user": v}, "y": "0", "t": None}
        for i, v in enumerate(values)
    ]
    fz = featurizer(rng)
    chunk = stored(rows)
    want = hotrows.parse_rows(chunk, encode=specs(fz), passthrough=fz.rt.passthrough)
    assert_same(hotrows._scan(chunk, specs(fz), fz.rt.passthrough), want)


@pytest.mark.parametrize(
    ("feature", "value"),
    [
        ("user", 'a "quoted" value'),  # escapes: every quote is no longer a string's edge
        ("user", "back\\slash"),
        ("user", "line\nbreak"),
        ("user", [1, "two"]),  # a list as a value (validation lets it through)
        ("user", {"nested": 1}),
        ("user", "brace } and [bracket"),  # inside a string: read by the scanner itself
        ("age", "24"),  # a string for a numeric feature: float("24") buckets, passthrough NaN
        ("age", True),  # a boolean for a numeric feature
        ("count", False),
    ],
)
def test_other_shapes_fall_back_to_orjson_and_agree(feature: str, value: object) -> None:
    rng = np.random.default_rng(3)
    fz = featurizer(rng)
    rows = random_rows(rng, 40)
    rows[17]["f"][feature] = value  # type: ignore[index]
    chunk = stored(rows)
    kw = {"encode": specs(fz), "passthrough": fz.rt.passthrough}
    want = hotrows.parse_rows(chunk, **kw)
    assert_same(hotrows.parse_chunk(chunk, **kw), want)
    if value == "brace } and [bracket":
        hotrows._scan(chunk, kw["encode"], kw["passthrough"])  # no fallback needed
    else:
        with pytest.raises(hotrows._Unsupported):
            hotrows._scan(chunk, kw["encode"], kw["passthrough"])


def test_rows_not_in_ingest_shape_fall_back() -> None:
    """Missing or extra keys of a row, "f" not an object, an id that is not a string: the
    scanner refuses, and parse_chunk does what parse_rows does (including its errors)."""
    fz = featurizer(np.random.default_rng(4))
    kw = {"encode": specs(fz), "passthrough": fz.rt.passthrough}
    good = {"id": "a", "f": {"user": "u"}, "y": "1", "t": None}
    extra = {**good, "x": {"user": "v"}}
    for rows in ([good, extra], [{**good, "f": {}}, good], [{**good, "y": None}]):
        chunk = stored(rows)
        assert_same(hotrows.parse_chunk(chunk, **kw), hotrows.parse_rows(chunk, **kw))
    for bad in (
        [good, {"id": "b", "y": "1", "t": None}],
        [{**good, "f": None}],
        [{**good, "id": 5}],
    ):
        chunk = stored(bad)
        with pytest.raises(hotrows._Unsupported):
            hotrows._scan(chunk, kw["encode"], kw["passthrough"])
        with pytest.raises((KeyError, TypeError, AttributeError)):
            hotrows.parse_rows(chunk, **kw)
        with pytest.raises((KeyError, TypeError, AttributeError)):
            hotrows.parse_chunk(chunk, **kw)


def _old_record_batch(
    fz: Featurizer, schema: pa.Schema, window: int, rows: bytes
) -> pa.RecordBatch:
    """The train set's record batch as it was made before the chunk reader: every row parsed,
    featurized from its feature dict (``Featurizer.transform``), then transposed."""
    recs = orjson.loads(b"[" + rows + b"]")
    matrix = fz.transform([r["f"] for r in recs])
    arrays = [
        pa.array([r["id"] for r in recs], pa.string()),
        pa.array([r["t"] for r in recs], pa.string()),
        pa.array(np.full(len(recs), window, np.int64)),
        pa.array([r["y"] for r in recs], pa.string()),
    ]
    arrays += [pa.array(col) for col in np.ascontiguousarray(matrix.T)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def assert_batches_equal(got: pa.RecordBatch, want: pa.RecordBatch) -> None:
    assert got.schema.equals(want.schema, check_metadata=True)
    assert got.num_rows == want.num_rows
    for name, a, b in zip(want.schema.names, got.columns, want.columns, strict=True):
        if pa.types.is_floating(b.type):
            x, y = a.to_numpy(), b.to_numpy()
            assert np.array_equal(x.view(np.int64), y.view(np.int64)), name
        else:
            assert a.equals(b), name


@pytest.mark.parametrize("n", [1, 5, 8, 9, 200, 700])  # both sides of FEW_ROWS
def test_record_batch_equals_the_row_by_row_path(n: int) -> None:
    rng = np.random.default_rng(100 + n)
    fz = featurizer(rng)
    schema = features._schema(fz)
    rows = stored(random_rows(rng, n))
    want = _old_record_batch(fz, schema, 3, rows)
    assert_batches_equal(_one(features._json_batches(fz, schema, 3, rows)), want)
    # the counted form (what the counting job keeps, Arrow IPC) gives the same batch
    chunk = hotrows.parse_chunk(rows, encode=list(fz.rt.features), passthrough=fz.rt.passthrough)
    blob = hotrows.to_ipc(chunk, after=b"", last=b"9-9", passthrough=fz.rt.passthrough)
    assert hotrows.bounds_of(blob) == (b"", b"9-9")
    assert_batches_equal(_one(features._counted_batches(fz, schema, 3, blob)), want)
    assert want.schema.names[4:] == fz.columns and len(fz.columns) == 9 * len(TABLES) + 2


def test_counted_runs_are_stored_compressed() -> None:
    """A counted run is kept in Redis for the whole hot period beside the rows' JSON: its
    buffers are zstd-compressed (much smaller than the same batch written plain)."""
    rng = np.random.default_rng(5)
    fz = featurizer(rng)
    rows = stored(random_rows(rng, 2000))
    chunk = hotrows.parse_chunk(rows, encode=list(fz.rt.features), passthrough=fz.rt.passthrough)
    blob = hotrows.to_ipc(chunk, after=b"", last=b"9-9", passthrough=fz.rt.passthrough)
    batch = pa.ipc.open_stream(blob).read_next_batch()
    plain = pa.BufferOutputStream()
    with pa.ipc.new_stream(plain, batch.schema) as writer:
        writer.write_batch(batch)
    assert len(blob) < 0.6 * len(plain.getvalue())


def test_record_batch_equals_the_row_by_row_path_when_falling_back() -> None:
    rng = np.random.default_rng(11)
    fz = featurizer(rng)
    schema = features._schema(fz)
    rows = random_rows(rng, 50)
    rows[3]["f"]["user"] = 'say "hi"'  # type: ignore[index]
    chunk = stored(rows)
    assert_batches_equal(
        _one(features._json_batches(fz, schema, 1, chunk)), _old_record_batch(fz, schema, 1, chunk)
    )


def _one(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    assert len(batches) == 1
    return batches[0]


JSONABLE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
NUMBERS = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.dictionaries(st.sampled_from(["user", "item", "id", LONG, "zzz"]), JSONABLE),
            st.dictionaries(st.sampled_from(["age", "t", "count"]), NUMBERS),
            st.one_of(st.none(), st.text(max_size=5)),
            st.sampled_from(LABELS),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_parse_chunk_equals_parse_rows_property(
    rows: list[tuple[dict[str, object], dict[str, object], str | None, str]],
) -> None:
    fz = featurizer(np.random.default_rng(0))
    chunk = stored([{"id": i, "f": {**c, **x}, "y": y, "t": None} for c, x, i, y in rows])
    kw = {"encode": specs(fz), "passthrough": fz.rt.passthrough}
    assert_same(hotrows.parse_chunk(chunk, **kw), hotrows.parse_rows(chunk, **kw))


async def test_trainset_reads_ingested_rows_without_falling_back_and_streams_ipc_bytes(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the service: rows as ingest stores them are read by the scanner (the row-by-row
    reader is never called), featurized as ``Featurizer.transform`` does, chunk after chunk in
    order (several featurized at once), and the Arrow body is byte for byte what
    ``pa.ipc.new_stream`` writes for the same batches."""
    monkeypatch.setattr(features, "TRAINSET_CHUNK", 6)
    name = unique("ipc")
    assert (await api.post("/v1/streams", json=stream_body(name, hot_windows=2))).status_code == 201
    rng = np.random.default_rng(5)
    observations = []
    for i in range(40):
        f: dict[str, object] = {
            "user": str(rng.choice(["alice", "bob", "é", "a-much-longer-user-name", "7"])),
            "item": [3, 3.5, True, "x", None][i % 5],
            "age": [17, 18, 24.5, None, -3, 1e6][i % 6],
        }
        if i % 7 == 0:
            del f["item"]
        observations.append({"id": f"r{i}", "features": f, "label": str(i % 2)})
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": observations}
    )
    assert r.status_code == 202

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("fell back to the row-by-row reader")

    monkeypatch.setattr(hotrows, "parse_rows", refuse)
    r = await api.get(f"/v1/streams/{name}/trainset", role="model")
    assert r.status_code == 200
    fz = await features.featurizer(ctx=api.ctx, name=name)
    table = pa.ipc.open_stream(r.content).read_all()
    assert table.column("id").to_pylist() == [f"r{i}" for i in range(40)]
    assert table.column("label").to_pylist() == [str(i % 2) for i in range(40)]
    got = np.column_stack([table.column(c).to_numpy() for c in fz.columns])
    want = fz.transform([o["features"] for o in observations])
    assert np.array_equal(got.view(np.int64), want.view(np.int64))

    batches = [b async for b in features.train_batches(api.ctx, fz)]
    assert [b.num_rows for b in batches] == [6] * 6 + [4]
    buf = io.BytesIO()
    with pa.ipc.new_stream(buf, features._schema(fz)) as writer:
        for b in batches:
            writer.write_batch(b)
    assert r.content == buf.getvalue()


async def test_trainset_from_counted_runs_equals_the_trainset_from_json(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows the counting job has counted reach the train set by column (its Arrow IPC runs),
    the rest as JSON: the download holds bit for bit the rows read all from JSON, whether the
    window is counted in full, in part, or not at all; and the runs go with the hot data."""

    monkeypatch.setattr(features, "TRAINSET_CHUNK", 7)
    monkeypatch.setattr(counting, "COUNT_CHUNK", 9)
    # batches written without the list of batches to count: the counter reads their JSON in
    # runs of COUNT_CHUNK entries (tests/counting/test_listed.py covers listed batches)
    real_accept = IngestStore.accept

    async def unlisted(self: IngestStore, **kw: Any) -> Any:
        return await real_accept(self, **{**kw, "listed": False})

    monkeypatch.setattr(IngestStore, "accept", unlisted)
    name = unique("runs")
    body = stream_body(name, hot_windows=2)
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    rng = np.random.default_rng(8)

    async def send(k: int) -> None:
        observations = [
            {
                "id": f"r{k}-{i}",
                "features": {
                    "user": str(rng.choice(["alice", "bob", "é", "7"])),
                    "item": [3, 3.5, True, "x", None][i % 5],
                    "age": [17, 18, 24.5, None, -3, 1e6][i % 6],
                },
                "label": str(i % 2),
            }
            for i in range(30)
        ]
        r = await api.post(
            f"/v1/streams/{name}/observations", role="producer", json={"observations": observations}
        )
        assert r.status_code == 202

    async def download() -> bytes:
        r = await api.get(f"/v1/streams/{name}/trainset", role="model")
        assert r.status_code == 200
        return r.content

    rt = await features.streams.runtime(ctx=api.ctx, name=name)
    store = api.ctx.stores.windows
    await send(0)
    await counting.count_window(ctx=api.ctx, rt=rt, window=1)  # window 1 counted in full
    assert await store.cols_length(name, 1) == 4  # runs of 9, 9, 9, 3
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    await send(1)
    hot = api.ctx.keys.hot(name, 2)
    entries = await api.ctx.redis.xrange(hot, count=12)
    # window 2 counted in part: the first 12 of its 30 rows (the rest is read as JSON)
    monkeypatch.setattr(counting, "COUNT_CHUNK", 12)
    monkeypatch.setattr(store, "hot_last_id", _fixed(entries[-1][0], store.hot_last_id, name, 2))
    assert await counting.count_window(ctx=api.ctx, rt=rt, window=2) == 12
    monkeypatch.undo()
    monkeypatch.setattr(features, "TRAINSET_CHUNK", 7)
    monkeypatch.setattr(IngestStore, "accept", unlisted)
    assert await store.cols_length(name, 2) == 1
    with_runs = await download()
    for w in (1, 2):
        await api.ctx.redis.delete(api.ctx.keys.cols(name, w))
    table = pa.ipc.open_stream(with_runs).read_all()
    from_json = pa.ipc.open_stream(await download()).read_all()
    assert_batches_equal(
        table.combine_chunks().to_batches()[0], from_json.combine_chunks().to_batches()[0]
    )
    assert table.num_rows == 60 and table.column("id").to_pylist()[:2] == ["r0-0", "r0-1"]
    await counting.count_window(ctx=api.ctx, rt=rt, window=1)  # (a no-op: counted)
    await store.delete_hot(name, 1)
    assert not await api.ctx.redis.exists(api.ctx.keys.cols(name, 1))


def _fixed(last: bytes, real, name: str, window: int):  # type: ignore[no-untyped-def]
    """``hot_last_id`` that reports ``last`` for one window (a snapshot taken earlier)."""

    async def hot_last_id(s: str, w: int, p: int = 0) -> bytes | None:
        return last if (s, w, p) == (name, window, 0) else await real(s, w, p)

    return hot_last_id


@pytest.mark.parametrize("n_features", [300, 1000])  # no 2^16-slot table: binary search
def test_scan_reads_many_features(n_features: int) -> None:
    rng = np.random.default_rng(n_features)
    specs_ = [FeatureSpec(f"feature_{i:04d}_of_many", "categorical") for i in range(n_features)]
    rows = [
        {
            "id": str(i),
            "f": {s.name: str(rng.integers(0, 5)) for s in specs_ if rng.random() < 0.5},
            "y": "1",
            "t": None,
        }
        for i in range(20)
    ]
    chunk = stored(rows)
    want = hotrows.parse_rows(chunk, encode=specs_, passthrough=[])
    assert_same(hotrows._scan(chunk, specs_, []), want)
