"""``Client`` (sync) and ``SelectivityFeaturizer`` against ``selectivity serve`` in a
subprocess, some calls through a proxy that loses answers or cuts connections."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from selectivity_client import AsyncClient, Client, RetrainRequired, Unavailable, epoch_of
from selectivity_client.sklearn import SelectivityFeaturizer
from sklearn.base import clone
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.pipeline import make_pipeline

from tests.client.faults import FaultyProxy, drop_after_first_event, drop_answers
from tests.helpers import stream_body
from tests.serving import Server, serving

pytestmark = pytest.mark.slow  # `selectivity serve` in a subprocess


@dataclass
class Live:
    server: Server
    admin: httpx.Client
    keys: dict[str, str]

    def stream(self, **over: Any) -> str:
        name = f"cli-{secrets.token_hex(4)}"
        r = self.admin.post("/v1/streams", json=stream_body(name, **over))
        assert r.status_code == 201, r.text
        return name

    def roll(self, name: str) -> int:
        """Force a roll and wait until featurize serves the new epoch (the worker prepares
        it just after)."""
        r = self.admin.post(f"/v1/streams/{name}/roll")
        assert r.status_code == 200, r.text
        epoch = int(r.json()["epoch"])
        for _ in range(300):
            if self.admin.get(f"/v1/streams/{name}/windows").json()["served_epoch"] == epoch:
                return epoch
            time.sleep(0.1)
        raise AssertionError(f"epoch {epoch} not served after 30 s")

    def observations(self, name: str, window: int) -> int:
        r = self.admin.get(f"/v1/streams/{name}/windows")
        return {w["epoch"]: w["observations"] for w in r.json()["windows"]}[window]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with serving(tmp_path_factory.mktemp("client-server")) as server:
        admin = httpx.Client(
            base_url=server.base,
            headers={"Authorization": f"Bearer {server.admin_key}"},
            timeout=60,
        )
        keys = {}
        for role in ("model", "producer"):
            r = admin.post("/v1/admin/keys", json={"role": role})
            assert r.status_code == 201, r.text
            keys[role] = r.json()["key"]
        yield Live(server, admin, keys)
        admin.close()
        server.stop()


def frame(n: int, seed: int) -> pd.DataFrame:
    """Clicks whose label depends on the user: the count features carry signal."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 20, n)
    return pd.DataFrame(
        {
            "user": [f"u{u}" for u in users],
            "item": [f"i{i}" for i in rng.integers(0, 10, n)],
            "age": rng.integers(18, 70, n),
            "label": np.where(rng.random(n) < np.where(users < 10, 0.9, 0.1), "1", "0"),
        }
    )


def test_a_lost_ingest_answer_is_retried_and_counted_once(live: Live) -> None:
    """The server accepts the first batch but its answer never arrives: the client retries
    with the batch's key, the service replays its answer, and the rows count once."""
    name = live.stream()
    proxy = FaultyProxy(live.server.base, drop_answers(first=1))
    with Client(proxy.base, live.keys["producer"], stream=name, backoff=0.05) as c:
        res = c.ingest(frame(6, seed=1), idempotency_key="nightly-1")
    proxy.close()
    assert (res.accepted, res.batches, res.replayed) == (6, 1, 1)
    assert b"idempotency-key: nightly-1:0-6" in proxy.requests[0].lower()
    assert live.observations(name, 1) == 6


def test_no_answer_at_all_is_unavailable_after_the_retries(live: Live) -> None:
    proxy = FaultyProxy(live.server.base, drop_answers(first=100))
    with (
        Client(proxy.base, live.keys["model"], stream="x", retries=2, backoff=0.01) as c,
        pytest.raises(Unavailable) as exc,
    ):
        c.train_set()
    proxy.close()
    assert len(proxy.requests) == 3 and exc.value.status == 0


def test_events_resume_after_a_dropped_connection(live: Live) -> None:
    """The first connection is cut after one event; the client reconnects with
    Last-Event-ID and gets each of the rest exactly once."""
    name = live.stream()
    for _ in range(3):
        live.roll(name)
    with Client(live.server.base, live.keys["model"], stream=name) as direct:
        backlog = [e.id for e in direct.events(follow_seconds=0, reconnect=False)]
    assert len(backlog) == 3
    proxy = FaultyProxy(live.server.base, drop_after_first_event)
    with Client(proxy.base, live.keys["model"], stream=name, backoff=0.05) as c:
        got = []
        for event in c.events(follow_seconds=0):
            got.append(event.id)
            if len(got) == 3:
                break
    proxy.close()
    assert got == backlog
    assert b"last-event-id: %d" % backlog[0] in proxy.requests[1].lower()


def test_train_set_then_a_pipeline_then_retrain_required(live: Live) -> None:
    """Ingest, roll, train a Pipeline(SelectivityFeaturizer, gradient boosting) on the
    rows; it predicts better than chance, clones, and refuses after the next roll."""
    name = live.stream(retrain_grace_seconds=0)  # hot_windows 1
    with Client(live.server.base, live.keys["producer"], stream=name, batch_size=500) as prod:
        assert prod.ingest(frame(2000, seed=2)).accepted == 2000
        live.roll(name)
        prod.ingest(frame(300, seed=3))
    model = Client(live.server.base, live.keys["model"], stream=name)
    table = model.train_set()
    assert epoch_of(table) == 2 and table.num_rows == 300  # the hot period: window 2
    assert set(table.column("window").to_pylist()) == {2}

    m = model.register_model("lr")
    feats = SelectivityFeaturizer(live.server.base, live.keys["model"], name, model_id=m["id"])
    assert live.keys["model"] not in repr(feats)
    pipe = make_pipeline(feats, HistGradientBoostingClassifier(max_iter=30))
    train = frame(400, seed=4)
    pipe.fit(train.drop(columns=["label"]), train["label"])
    assert feats.epoch_ == 2 and model.model(m["id"])["status"] == "current"
    test = frame(400, seed=5)
    accuracy = (pipe.predict(test.drop(columns=["label"])) == test["label"]).mean()
    assert accuracy > 0.75  # the user's count features carry the label (0.9 / 0.1)
    assert clone(feats).get_params()["stream"] == name

    live.roll(name)
    with pytest.raises(RetrainRequired):
        pipe.predict(test.drop(columns=["label"]))
    model.close()


async def test_async_client_resumes_events_and_streams_the_train_set(live: Live) -> None:
    name = live.stream()
    async with AsyncClient(live.server.base, live.keys["producer"], stream=name) as prod:
        assert (await prod.ingest(frame(50, seed=6).to_dict("records"))).accepted == 50
    for _ in range(2):
        live.roll(name)
    proxy = FaultyProxy(live.server.base, drop_after_first_event)
    async with AsyncClient(proxy.base, live.keys["model"], stream=name, backoff=0.05) as c:
        got = []
        async for event in c.events(follow_seconds=0):
            got.append((event.event, event.data["epoch"]))
            if len(got) == 2:
                break
        table = await c.train_set()
    proxy.close()
    assert got == [("roll", 2), ("roll", 3)]
    assert b"last-event-id: " in proxy.requests[1].lower()
    assert epoch_of(table) == 3 and table.num_rows == 0  # hot_windows 1, nothing since
