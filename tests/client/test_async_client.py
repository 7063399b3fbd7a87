"""``AsyncClient`` against the app in this process (httpx over ASGI) on the real Redis and SQL
backends of the suite: featurize, the train set, models, events, ingest batching and its
idempotency keys, typed errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pandas as pd
import pyarrow as pa
import pytest
from selectivity_client import (
    AsyncClient,
    Forbidden,
    NotFound,
    RetrainRequired,
    Unauthorized,
    ValidationError,
    epoch_of,
)

from service.app import create_app
from tests.conftest import Api, Jobs
from tests.helpers import new_stream


def features(n: int, start: int = 0) -> list[dict[str, Any]]:
    """Rows to featurize: feature values only."""
    return [{k: v for k, v in r.items() if k not in ("id", "label")} for r in rows(n, start)]


def rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    """Observations as flat rows: id, label and the features."""
    return [
        {
            "id": f"r{i}",
            "user": f"u{i % 3}",
            "item": f"i{i % 5}",
            "age": 20 + i % 40,
            "label": str(i % 2),
        }
        for i in range(start, start + n)
    ]


@pytest.fixture
async def clients(api: Api) -> AsyncIterator[dict[str, AsyncClient]]:
    transport = httpx.ASGITransport(app=create_app(ctx=api.ctx))
    made = {
        role: AsyncClient("http://test", api.keys[role], transport=transport, backoff=0.01)
        for role in ("model", "producer", "admin")
    }
    yield made
    for c in made.values():
        await c.aclose()


async def windows(api: Api, name: str) -> dict[int, int | None]:
    r = await api.get(f"/v1/streams/{name}/windows")
    return {w["epoch"]: w["observations"] for w in r.json()["windows"]}


async def test_model_manager_round_trip(
    api: Api, jobs: Jobs, clients: dict[str, AsyncClient]
) -> None:
    """Ingest a DataFrame, roll, read the train set and featurize at the same epoch; a model
    with grace 0 is refused until it reports a training, and RetrainRequired after the next
    roll; the events of both rolls, resumed after an id."""
    name = await new_stream(api, "cli", retrain_grace_seconds=0)
    model, producer = clients["model"], clients["producer"]
    res = await producer.ingest(pd.DataFrame(rows(30)), stream=name)
    assert (res.accepted, res.windows, res.batches, res.replayed) == (30, [1], 1, 0)
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    await jobs()
    await producer.ingest(rows(10, start=100), stream=name)

    table = await model.train_set(stream=name)
    assert isinstance(table, pa.Table) and epoch_of(table) == 2
    assert table.num_rows == 10 and sorted(table.column("id").to_pylist()) == sorted(
        f"r{i}" for i in range(100, 110)
    )
    feats = await model.featurize(pd.DataFrame(features(4)), stream=name)
    assert isinstance(feats, pd.DataFrame) and feats.attrs["selectivity_epoch"] == 2
    assert len(feats) == 4
    assert list(feats.columns) == [
        c for c in table.column_names if c not in ("id", "event_time", "window", "label")
    ]
    # a batch size of 1 featurizes the same rows the same way, in order
    one = await AsyncClient(
        "http://test",
        api.keys["model"],
        transport=httpx.ASGITransport(app=create_app(ctx=api.ctx)),
        batch_size=1,
        output="arrow",
    ).featurize(features(4), stream=name)
    assert one.to_pandas().equals(feats)

    m = await model.register_model("ranker", stream=name)
    assert m["status"] == "refused"  # never trained, grace 0
    with pytest.raises(RetrainRequired) as exc:
        await model.featurize(features(1), stream=name, model_id=m["id"])
    assert exc.value.status == 409 and "retrain" in exc.value.detail
    assert (await model.report_trained(m["id"], 2, stream=name))["status"] == "current"
    assert len(await model.featurize(features(2), stream=name, model_id=m["id"])) == 2

    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 3}
    with pytest.raises(RetrainRequired):
        await model.featurize(features(1), stream=name, model_id=m["id"])
    assert (await model.model(m["id"], stream=name))["status"] == "refused"

    seen = [e async for e in model.events(stream=name, follow_seconds=0, reconnect=False)]
    kinds = [(e.event, e.data["epoch"]) for e in seen]
    assert kinds == [("roll", 2), ("roll", 3), ("retrain_required", 3)]
    assert m["id"] in seen[-1].data["models"]
    ids = [e.id for e in seen]
    assert ids == sorted(set(ids))
    rest = [
        e.id
        async for e in model.events(
            stream=name, follow_seconds=0, reconnect=False, last_event_id=ids[0]
        )
    ]
    assert rest == ids[1:]


async def test_ingest_batches_each_with_its_own_key_and_repeats_count_once(
    api: Api, clients: dict[str, AsyncClient]
) -> None:
    name = await new_stream(api, "cli")
    producer = AsyncClient(
        "http://test",
        api.keys["producer"],
        transport=httpx.ASGITransport(app=create_app(ctx=api.ctx)),
        batch_size=2,
    )
    first = await producer.ingest(rows(5), stream=name, idempotency_key="load-7")
    assert (first.accepted, first.batches, first.replayed) == (5, 3, 0)
    again = await producer.ingest(rows(5), stream=name, idempotency_key="load-7")
    assert (again.accepted, again.batches, again.replayed) == (5, 3, 3)
    assert (await windows(api, name))[1] == 5  # counted once
    # the same key on other rows is another batch body: the service refuses it, typed
    with pytest.raises(ValidationError):
        await producer.ingest(rows(5, start=50), stream=name, idempotency_key="load-7")
    await producer.aclose()


async def test_ingest_halves_batches_the_service_finds_too_large(
    api: Api, clients: dict[str, AsyncClient]
) -> None:
    api.ctx.settings = api.ctx.settings.model_copy(update={"max_batch": 2})
    name = await new_stream(api, "cli")
    res = await clients["producer"].ingest(rows(7), stream=name)
    assert res.accepted == 7 and res.batches == 4  # 7 -> 3 + 4 -> 1 + 2 + 2 + 2
    assert (await windows(api, name))[1] == 7


async def test_errors_are_typed_from_the_service_bodies(
    api: Api, clients: dict[str, AsyncClient]
) -> None:
    name = await new_stream(api, "cli")
    model = clients["model"]
    with pytest.raises(NotFound) as nf:
        await model.featurize(features(1), stream="no-such-stream")
    assert nf.value.status == 404 and nf.value.kind == "NotFound"
    with pytest.raises(Forbidden):
        await clients["producer"].featurize(features(1), stream=name)
    bad = AsyncClient(
        "http://test", "sk_nope_nope", transport=httpx.ASGITransport(app=create_app(ctx=api.ctx))
    )
    with pytest.raises(Unauthorized):
        await bad.train_set(stream=name)
    m = await model.register_model("m", stream=name)
    with pytest.raises(ValidationError) as ve:
        await model.report_trained(m["id"], 0, stream=name)
    assert ve.value.status == 422 and "epoch" in ve.value.detail
    with pytest.raises(ValueError, match="stream"):
        await model.featurize(features(1))  # no stream anywhere: said before anything is sent
    await bad.aclose()
