from __future__ import annotations

import io
import math

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.core.features.columns import column_names
from tests.conftest import Api, unique
from tests.helpers import obs, stream_body


async def _setup(api: Api, **over: object) -> str:
    """A stream with one counted window (window 1) and two hot rows in window 2."""
    name = unique("feat")
    assert (await api.post("/v1/streams", json=stream_body(name, **over))).status_code == 201
    rows = (
        [obs("alice", "x", 20, "1")] * 6
        + [obs("alice", "y", 30, "0")] * 2
        + [obs("bob", "x", 60, "0")] * 4
    )
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": rows}
    )
    assert r.status_code == 202
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [obs("alice", "x", 20, "1", "h1"), obs("carol", "z", 40, "0", "h2")]},
    )
    assert r.json()["window"] == 2
    return name


async def test_featurize_columns_counts_probabilities_and_backoff(api: Api) -> None:
    name = await _setup(api)
    r = await api.post(
        f"/v1/streams/{name}/featurize",
        role="model",
        json={
            "rows": [
                {"user": "alice", "item": "x", "age": 21},
                {"user": "nobody"},
                {"user": "bob", "item": None, "age": 70.5},
            ],
            "model_id": None,
        },
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["epoch"] == 2
    assert out["columns"] == column_names(["user", "item", "age"], ["0", "1"], ["age"])
    assert out["columns"][:7] == [
        "user:count:0",
        "user:count:1",
        "user:total",
        "user:p:1",
        "user:logodds:1",
        "user:backoff",
        "item:count:0",
    ]
    row = dict(zip(out["columns"], out["rows"][0], strict=True))
    assert (row["user:count:0"], row["user:count:1"], row["user:total"]) == (2.0, 6.0, 8.0)
    prior1 = (6 + 1) / (12 + 2)  # add-one smoothed prior of label "1": 6 of 12
    assert row["user:p:1"] == pytest.approx((6 + 1.0 * prior1) / (8 + 1.0))
    assert row["user:logodds:1"] == pytest.approx(math.log(row["user:p:1"] / (1 - row["user:p:1"])))
    assert row["item:count:1"] == 6.0 and row["item:count:0"] == 4.0
    assert row["age:count:1"] == 6.0  # 20 and 21 share the bucket [18, 25)
    assert row["user:backoff"] == 0.0  # no noise: threshold 0
    assert row["age:value"] == 21.0
    unseen = dict(zip(out["columns"], out["rows"][1], strict=True))
    assert unseen["user:total"] == 0.0 and unseen["user:p:1"] == pytest.approx(prior1)
    assert unseen["age:value"] is None  # missing passthrough value → null
    bob = dict(zip(out["columns"], out["rows"][2], strict=True))
    assert bob["user:count:0"] == 4.0 and bob["age:count:0"] == 4.0  # 60 and 70.5: bucket 56+


async def test_backoff_under_noise_falls_back_to_the_prior(api: Api) -> None:
    """Unseen keys under noise: their n̂ is noise, mostly below the threshold (one σ of the
    summed noise × sqrt(L)); every backed-off row's p is exactly the (noisy) prior."""
    name = await _setup(api, privacy={"mechanism": "laplace", "epsilon": 0.5})
    r = await api.post(
        f"/v1/streams/{name}/featurize",
        role="model",
        json={"rows": [{"user": f"nobody-{i}"} for i in range(50)]},
    )
    out = r.json()
    j_b, j_p = out["columns"].index("user:backoff"), out["columns"].index("user:p:1")
    backed = [row[j_p] for row in out["rows"] if row[j_b] == 1.0]
    # P(n̂ ≥ threshold) for one unseen key is well under 1/2, so P(no back-off in 50) < 1e-15
    assert len(backed) > 0
    assert len(set(backed)) == 1
    kept = [row[j_p] for row in out["rows"] if row[j_b] == 0.0]
    assert all(p != backed[0] for p in kept)


async def test_featurize_refuses_bad_rows(api: Api) -> None:
    name = await _setup(api)
    for body, status, needle in [
        ({"rows": [{"nope": 1}]}, 422, "nope"),
        ({"rows": []}, 422, "rows"),
        ({"rows": [{"age": "x"}]}, 422, "numeric"),
        ({"rows": [{"user": "u"}] * (api.ctx.settings.max_batch + 1)}, 413, "limit"),
    ]:
        r = await api.post(f"/v1/streams/{name}/featurize", role="model", json=body)
        assert r.status_code == status, r.text
        assert needle in r.json()["detail"]
    r = await api.post(f"/v1/streams/{name}/featurize", role="producer", json={"rows": [{}]})
    assert r.status_code == 403


async def test_trainset_in_three_formats(api: Api) -> None:
    name = await _setup(api)
    r = await api.get(f"/v1/streams/{name}/trainset", role="model")
    assert r.status_code == 200
    assert r.headers["X-Selectivity-Epoch"] == "2"
    assert r.headers["content-type"] == "application/vnd.apache.arrow.stream"
    table = pa.ipc.open_stream(r.content).read_all()
    assert table.num_rows == 2  # the hot period (window 2) only
    assert table.column_names[:4] == ["id", "event_time", "window", "label"]
    fz = await api.post(
        f"/v1/streams/{name}/featurize",
        role="model",
        json={
            "rows": [
                {"user": "alice", "item": "x", "age": 20},
                {"user": "carol", "item": "z", "age": 40},
            ]
        },
    )
    assert table.column_names[4:] == fz.json()["columns"]
    np.testing.assert_allclose(
        np.array([table.column(c).to_numpy() for c in table.column_names[4:]]).T,
        np.array(fz.json()["rows"], dtype=float),
    )
    assert table.column("id").to_pylist() == ["h1", "h2"]
    assert table.column("label").to_pylist() == ["1", "0"]

    r = await api.get(f"/v1/streams/{name}/trainset?format=parquet", role="model")
    pt = pq.read_table(io.BytesIO(r.content))
    assert pt.equals(table.replace_schema_metadata(pt.schema.metadata))

    r = await api.get(f"/v1/streams/{name}/trainset?format=ndjson", role="model")
    lines = [orjson.loads(x) for x in r.content.splitlines()]
    assert [x["id"] for x in lines] == ["h1", "h2"]
    assert lines[0]["user:count:1"] == 6.0

    r = await api.get(f"/v1/streams/{name}/trainset?format=csv", role="model")
    assert r.status_code == 422


async def test_trainset_streams_many_chunks(api: Api) -> None:
    """More rows than one chunk: the train set arrives as several record batches."""
    from service.features import service as features

    name = unique("big")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    n = features.TRAINSET_CHUNK + 1500
    for start in range(0, n, 2000):
        batch = [
            obs(f"u{i % 50}", f"i{i % 7}", i % 80, str(i % 2), f"r{i}")
            for i in range(start, min(n, start + 2000))
        ]
        r = await api.post(
            f"/v1/streams/{name}/observations", role="producer", json={"observations": batch}
        )
        assert r.status_code == 202
    r = await api.get(f"/v1/streams/{name}/trainset", role="model")
    reader = pa.ipc.open_stream(r.content)
    batches = list(reader)
    assert len(batches) >= 2
    ids = [x for b in batches for x in b.column(0).to_pylist()]
    assert ids == [f"r{i}" for i in range(n)]
