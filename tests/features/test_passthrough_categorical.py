"""Raw categorical values as model features over HTTP: featurize answers ``<f>:value`` as a
string (null when missing), the train set carries the same string for the same row in every
format (Arrow: a string column), the user key is refused (422 naming it), and
the reference model trains on the float columns alone."""

from __future__ import annotations

import io

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from service.features import service as features
from service.reference import service as reference
from tests.conftest import Api, unique
from tests.helpers import obs, stream_body

FEATURES = [
    {"name": "user", "kind": "categorical"},
    {"name": "item", "kind": "categorical", "passthrough": True},
    {"name": "age", "kind": "numeric", "buckets": [18, 25, 35, 45, 56], "passthrough": True},
]


async def _setup(api: Api, **over: object) -> str:
    name = unique("ptc")
    body = stream_body(name, **{"features": FEATURES, **over})
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    rows = [obs("alice", "x", 20, "1")] * 6 + [obs("bob", "y", 60, "0")] * 4
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": rows}
    )
    assert r.status_code == 202
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    hot = [
        obs("alice", "x", 20, "1", "h1"),
        {"features": {"user": "carol", "age": 40}, "label": "0", "id": "h2"},  # no item
        {"features": {"user": "dan", "item": 196, "age": 30}, "label": "1", "id": "h3"},
    ]
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": hot}
    )
    assert r.status_code == 202
    return name


HOT_ROWS = [
    {"user": "alice", "item": "x", "age": 20},
    {"user": "carol", "age": 40},
    {"user": "dan", "item": 196, "age": 30},
]


async def test_featurize_and_train_set_carry_the_same_raw_values(api: Api) -> None:
    name = await _setup(api)
    r = await api.post(f"/v1/streams/{name}/featurize", role="model", json={"rows": HOT_ROWS})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["columns"][-2:] == ["age:value", "item:value"]
    served = [dict(zip(out["columns"], row, strict=True)) for row in out["rows"]]
    assert [s["item:value"] for s in served] == ["x", None, "196"]
    assert [s["age:value"] for s in served] == [20.0, 40.0, 30.0]
    assert served[0]["item:count:1"] == 6.0  # the count columns as before

    r = await api.get(f"/v1/streams/{name}/trainset", role="model")
    table = pa.ipc.open_stream(r.content).read_all()
    assert table.column_names[4:] == out["columns"]
    assert table.schema.field("item:value").type == pa.string()
    assert table.column("id").to_pylist() == ["h1", "h2", "h3"]
    assert table.column("item:value").to_pylist() == ["x", None, "196"]
    floats = [c for c in out["columns"] if c != "item:value"]
    np.testing.assert_allclose(
        np.array([table.column(c).to_numpy() for c in floats]).T,
        np.array([[s[c] for c in floats] for s in served], dtype=float),
    )

    r = await api.get(f"/v1/streams/{name}/trainset?format=parquet", role="model")
    pt = pq.read_table(io.BytesIO(r.content))
    assert pt.column("item:value").to_pylist() == ["x", None, "196"]
    r = await api.get(f"/v1/streams/{name}/trainset?format=ndjson", role="model")
    lines = [orjson.loads(x) for x in r.content.splitlines()]
    assert [x["item:value"] for x in lines] == ["x", None, "196"]


async def test_featurize_many_rows_and_without_categorical_passthrough(api: Api) -> None:
    name = await _setup(api)
    rows = [{"user": "u", "item": i % 3 if i % 4 else None} for i in range(1500)]
    r = await api.post(f"/v1/streams/{name}/featurize", role="model", json={"rows": rows})
    assert r.status_code == 200, r.text
    got = [row[-1] for row in r.json()["rows"]]
    assert got == [str(i % 3) if i % 4 else None for i in range(1500)]
    plain = await _setup(
        api, features=[FEATURES[0], {"name": "item", "kind": "categorical"}, FEATURES[2]]
    )
    r = await api.post(
        f"/v1/streams/{plain}/featurize", role="model", json={"rows": [{"item": "x"}]}
    )
    assert "item:value" not in r.json()["columns"]
    assert not any(isinstance(v, str) for v in r.json()["rows"][0])


async def test_the_user_key_is_refused_with_a_422_naming_it(api: Api) -> None:
    name = unique("ptc")
    body = stream_body(
        name,
        features=[{"name": "user", "kind": "categorical", "passthrough": True}, *FEATURES[1:]],
        privacy={"mechanism": "none", "user_key": "user"},
    )
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == 422, r.text
    assert "'user' is privacy.user_key, never passed through" in r.text


async def test_the_reference_model_reads_the_float_columns(api: Api) -> None:
    name = await _setup(api)
    fz = await features.featurizer(ctx=api.ctx, name=name)
    x, y = await reference._train_matrix(api.ctx, fz)
    assert x.dtype == np.float64 and x.shape == (3, len(fz.columns))
    assert y.tolist() == [1, 0, 1]


async def test_the_values_leave_with_the_hot_period(api: Api) -> None:
    """The raw values come from the hot window only: once its rows leave the hot period
    (hot_windows = 1: at the next roll) the train set no longer holds them."""
    name = await _setup(api)
    r = await api.get(f"/v1/streams/{name}/trainset", role="model")
    assert pa.ipc.open_stream(r.content).read_all().column("item:value").to_pylist() == [
        "x",
        None,
        "196",
    ]
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 3}
    r = await api.get(f"/v1/streams/{name}/trainset", role="model")
    table = pa.ipc.open_stream(r.content).read_all()
    assert table.num_rows == 0 and "item:value" in table.column_names


async def test_the_python_client_reads_the_string_columns(api: Api) -> None:
    from selectivity_client import _core

    name = await _setup(api)
    r = await api.post(f"/v1/streams/{name}/featurize", role="model", json={"rows": HOT_ROWS})
    table = _core.features_table([r.json()])
    assert table.schema.field("item:value").type == pa.string()
    assert table.schema.field("age:value").type == pa.float64()
    assert table.column("item:value").to_pylist() == ["x", None, "196"]
