"""A model-scored queue's uncertainty (docs/ARCHITECTURE.md, "Annotation queues", step 3, and
the stream's privacy ledger): the reference model's score of a released record is a non-DP
function of the hot rows the model was trained on. It is released only as the middle of its
bucket ⌊10u⌋, lives in Redis only while the model's epoch lasts (the next roll's release run
turns it into the fallback 0.5), is never written to SQL, and the label export carries none.
The ledger lists it as a non-DP release."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from service.db.models import AnnotationTask
from service.lifecycle import roll as lifecycle_roll
from service.queues import service as qservice
from service.reference import service as reference
from service.reference.schemas import PredictOut
from tests.conftest import Api, unique
from tests.helpers import stream_body
from tests.queues.test_queues import HOUR_MS, Clock, MaskSpy, lease_all, make_queue

P1 = 0.2876543219  # the model's probability of label '1': u = 2·P1 = 0.5753086438


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(qservice, "_now_ms", c)
    return c


@pytest.fixture
def keep_all(monkeypatch: pytest.MonkeyPatch) -> MaskSpy:
    s = MaskSpy(force=True)
    monkeypatch.setattr(qservice, "bernoulli_mask", s)
    return s


async def test_a_model_score_is_released_as_its_bucket_and_kept_only_for_its_epoch(
    qapi: Api, keep_all: MaskSpy, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique("qm")
    assert (await qapi.post("/v1/streams", json=stream_body(name))).status_code == 201
    q = await make_queue(
        qapi, payload_kind="record", stream=name, labels=None, uncertainty="model", k=1
    )
    epoch = (await qapi.get(f"/v1/streams/{name}", "analyst")).json()["epoch"]

    async def predict(*, ctx: Any, name: str, rows: list[dict]) -> PredictOut:
        p = [[1 - P1, P1]] * len(rows)
        return PredictOut(epoch=epoch, model_epoch=epoch, labels=["0", "1"], probabilities=p)

    monkeypatch.setattr(reference, "predict", predict)
    recs = [{"user": f"u{i}", "item": "i9", "age": 31} for i in range(3)]
    r = await qapi.post(
        f"/v1/queues/{q}/candidates", "curator", json={"candidates": [{"record": x} for x in recs]}
    )
    assert r.status_code == 200
    clock.ms += HOUR_MS
    await qservice.release_due(qapi.ctx)
    stats = (await qapi.get(f"/v1/queues/{q}/stats", "curator")).json()
    assert stats["uncertainty_histogram"][5] == 3  # the pool ranks by the bucket
    a, b = (await qapi.get(f"/v1/queues/{q}/next?n=2", "ann1")).json()["tasks"]
    assert a["uncertainty"] == b["uncertainty"] == 0.55  # ⌊10u⌋ = 5: never 0.5753086438
    # SQL never holds the model's score
    rt = await qservice.runtime(ctx=qapi.ctx, name=q)
    async with qapi.ctx.sessionmaker() as session:
        stmt = select(AnnotationTask.uncertainty).where(AnnotationTask.queue_id == rt.id)
        stored = list((await session.execute(stmt)).scalars())
    assert stored == [0.5, 0.5, 0.5]
    r = await qapi.post(f"/v1/queues/{q}/tasks/{a['id']}/label", "ann1", json={"label": "1"})
    assert r.status_code == 200, r.text
    (x,) = (await qapi.get(f"/v1/queues/{q}/labels", "curator")).json()["labels"]
    assert x["id"] == a["id"] and x["uncertainty"] is None  # the export carries none

    # the roll ends the model's epoch: the next release run forgets what it scored, in the
    # pool's ranking, in the scores a lease shows (b is leased now, the third task waits)
    assert await lifecycle_roll.roll(ctx=qapi.ctx, name=name) == epoch + 1
    assert await qservice.forget_model_scores(qapi.ctx, rt) == 3  # labelled a's entry too
    pool = await qapi.ctx.redis.zrange(qapi.ctx.keys.queue(q, "pool"), 0, -1, withscores=True)
    assert [u for _, u in pool] == [0.5]  # the one in the pool, now at the fallback
    scores = await qapi.ctx.redis.hvals(qapi.ctx.keys.queue(q, "scores"))
    assert scores == [b"0.5", b"0.5"]  # b's (leased) and the pool's
    (c,) = (await qapi.get(f"/v1/queues/{q}/next", "ann2")).json()["tasks"]
    assert c["uncertainty"] == 0.5
    clock.ms += 3600_000  # the leases (300 s) of b and c expire: back in the pool, at 0.5
    assert [t["uncertainty"] for t in await lease_all(qapi, q, "ann2")] == [0.5, 0.5]
    scored = await qapi.ctx.redis.hlen(qapi.ctx.keys.queue(q, "scored"))
    assert scored == 0
    assert await qservice.forget_model_scores(qapi.ctx, rt) == 0


async def test_the_stream_ledger_lists_a_model_queue_score_as_a_non_dp_release(
    qapi: Api,
) -> None:
    name = unique("qm")
    assert (await qapi.post("/v1/streams", json=stream_body(name))).status_code == 201
    q = await make_queue(
        qapi, payload_kind="record", stream=name, labels=None, uncertainty="model", k=1
    )
    client = await make_queue(qapi, payload_kind="record", stream=name, labels=None, k=1)
    led = (await qapi.get(f"/v1/streams/{name}/privacy", "analyst")).json()
    entries = [e for e in led["releases"] if e["kind"].endswith("model uncertainty")]
    assert [e["kind"] for e in entries] == [f"annotation queue {q} model uncertainty"]
    (e,) = entries
    assert e["dp"] is False and e["guarantee"].startswith("non-DP")
    assert e["epsilon"] is None and e["delta"] is None
    assert "⌊10u⌋" in e["reveals"] and "annotator" in e["to"]
    assert "epoch" in e["lifetime"] and "never stored in SQL" in e["lifetime"]
    assert not any(x["kind"] == f"annotation queue {client} model uncertainty" for x in entries)
