from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from service.models import repository
from service.models.service import signature, status_of
from tests.conftest import Api, Jobs
from tests.helpers import new_stream

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("trained", "stale_since", "epoch", "now_s", "expected"),
    [
        (5, None, 5, 0, "current"),
        (6, None, 5, 0, "current"),
        (4, T0, 5, 10, "stale"),
        (4, T0, 5, 100, "refused"),
        (4, T0, 5, 99.9, "stale"),
        (None, None, 1, 10, "untrained"),  # grace counts from registration
        (None, None, 1, 100, "refused"),
    ],
)
def test_status_of(trained, stale_since, epoch, now_s, expected) -> None:  # type: ignore[no-untyped-def]
    st, deadline = status_of(
        trained_epoch=trained,
        stale_since=stale_since,
        created_at=T0,
        epoch=epoch,
        grace_seconds=100,
        now=T0 + timedelta(seconds=now_s),
    )
    assert st == expected
    assert (deadline is None) == (expected == "current")


class Receiver:
    """A webhook receiver on loopback: fails the first ``fail_first`` calls with 500."""

    def __init__(self, fail_first: int = 0) -> None:
        self.calls: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(500 if len(outer.calls) <= fail_first else 204)
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def _featurize(api: Api, name: str, model_id: str | None):  # type: ignore[no-untyped-def]
    return await api.post(
        f"/v1/streams/{name}/featurize",
        role="model",
        json={"rows": [{"user": "u"}], "model_id": model_id},
    )


async def test_a_model_that_ignores_a_retrain_event_is_refused_then_served_again(
    api: Api, jobs: Jobs
) -> None:
    api.ctx.settings = api.ctx.settings.model_copy(
        update={"webhook_backoff_seconds": 0.05, "webhook_allow": "127.0.0.1/32"}
    )  # the receiver is on loopback: allowed by the operator
    receiver = Receiver(fail_first=1)
    try:
        name = await new_stream(api, "mdl", retrain_grace_seconds=0)
        r = await api.post(
            f"/v1/streams/{name}/models",
            role="model",
            json={"name": "ranker", "webhook_url": receiver.url},
        )
        assert r.status_code == 201, r.text
        model = r.json()
        secret = model["webhook_secret"]
        assert secret and model["status"] == "refused"  # never trained, grace 0
        mid = model["id"]
        r = await api.post(
            f"/v1/streams/{name}/models/{mid}/trained", role="model", json={"epoch": 1}
        )
        assert r.json()["status"] == "current"
        assert (await _featurize(api, name, mid)).status_code == 200

        assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
        r = await api.get(f"/v1/streams/{name}/models/{mid}", role="model")
        assert r.json()["status"] == "refused"  # grace 0: refused at once
        r = await _featurize(api, name, mid)
        assert r.status_code == 409 and r.json()["error"] == "RetrainRequired"
        assert "retrain" in r.json()["detail"]
        assert (await _featurize(api, name, None)).status_code == 200  # anonymous calls pass

        # the webhook arrives, signed, after one failed attempt (the roll's follow-up)
        await jobs()
        assert len(receiver.calls) == 2
        headers, body = receiver.calls[-1]
        ts = headers["x-selectivity-timestamp"]
        expected = (
            "sha256="
            + hmac.new(secret.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
        )
        assert hmac.compare_digest(headers["x-selectivity-signature"], expected)
        assert headers["x-selectivity-signature"] == signature(secret, ts, body)
        payload = json.loads(body)
        assert payload["event"] == "retrain_required" and payload["epoch"] == 2
        assert payload["model_id"] == mid and mid in payload["models"]
        for _ in range(50):  # the second attempt's record lands just after its response
            async with api.ctx.sessionmaker() as session:
                tries = await repository.deliveries(session, mid)
            if len(tries) == 2:
                break
            await asyncio.sleep(0.05)
        assert [(d.attempt, d.status_code) for d in tries] == [(1, 500), (2, 204)]

        # after retraining on the current epoch it is served again
        r = await api.post(
            f"/v1/streams/{name}/models/{mid}/trained", role="model", json={"epoch": 2}
        )
        assert r.json()["status"] == "current" and r.json()["stale_since"] is None
        assert (await _featurize(api, name, mid)).status_code == 200
    finally:
        receiver.close()


async def test_stale_models_are_served_during_the_grace_period(api: Api) -> None:
    name = await new_stream(api, "mdl", retrain_grace_seconds=3600)
    mid = (await api.post(f"/v1/streams/{name}/models", role="model", json={"name": "m"})).json()[
        "id"
    ]
    await api.post(f"/v1/streams/{name}/models/{mid}/trained", role="model", json={"epoch": 1})
    await api.post(f"/v1/streams/{name}/roll")
    out = (await api.get(f"/v1/streams/{name}/models/{mid}", role="model")).json()
    assert out["status"] == "stale" and out["trained_epoch"] == 1 and out["epoch"] == 2
    deadline = datetime.fromisoformat(out["retrain_deadline"])
    stale_since = datetime.fromisoformat(out["stale_since"])
    assert deadline - stale_since == timedelta(seconds=3600)
    assert (await _featurize(api, name, mid)).status_code == 200
    # training reported at an older epoch does not make it current
    r = await api.post(f"/v1/streams/{name}/models/{mid}/trained", role="model", json={"epoch": 1})
    assert r.json()["status"] == "stale"


async def test_events_are_server_sent_and_resumable(api: Api) -> None:
    name = await new_stream(api, "mdl")
    await api.post(f"/v1/streams/{name}/models", role="model", json={"name": "m"})
    for _ in range(2):
        await api.post(f"/v1/streams/{name}/roll")
    r = await api.get(f"/v1/streams/{name}/events?follow_seconds=0", role="model")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [block for block in r.text.split("\n\n") if block.strip()]
    parsed = []
    for block in events:
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        parsed.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
    kinds = [k for _, k, _ in parsed]
    assert kinds == ["roll", "retrain_required", "roll", "retrain_required"]
    assert [d["epoch"] for _, _, d in parsed] == [2, 2, 3, 3]
    ids = [i for i, _, _ in parsed]
    assert ids == sorted(ids)
    r = await api.client.get(
        f"/v1/streams/{name}/events?follow_seconds=0",
        headers={**api.auth("model"), "Last-Event-ID": str(ids[1])},
    )
    assert [
        int(line.split(": ")[1]) for line in r.text.splitlines() if line.startswith("id: ")
    ] == ids[2:]


async def test_model_errors(api: Api) -> None:
    name = await new_stream(api, "mdl")
    r = await api.post(f"/v1/streams/{name}/models", role="model", json={"name": "m"})
    mid = r.json()["id"]
    assert r.json()["webhook_secret"] is None  # no webhook, no secret
    r = await api.post(f"/v1/streams/{name}/models", role="model", json={"name": "m"})
    assert r.status_code == 409
    r = await api.post(f"/v1/streams/{name}/models/{mid}/trained", role="model", json={"epoch": 9})
    assert r.status_code == 422 and "ahead" in r.json()["detail"]
    r = await api.get(f"/v1/streams/{name}/models/m_0000000000000000", role="model")
    assert r.status_code == 404
    r = await api.post(
        f"/v1/streams/{name}/models", role="model", json={"name": "w", "webhook_url": "not a url"}
    )
    assert r.status_code == 422 and "webhook_url" in r.json()["detail"]
    r = await api.get("/v1/streams/nope/events?follow_seconds=0", role="model")
    assert r.status_code == 404
    r = await api.post(f"/v1/streams/{name}/models", role="producer", json={"name": "x"})
    assert r.status_code == 403


async def test_fetching_the_train_set_with_a_model_id_records_its_training(api: Api) -> None:
    name = await new_stream(api, "mdl")
    mid = (await api.post(f"/v1/streams/{name}/models", role="model", json={"name": "m"})).json()[
        "id"
    ]
    await api.post(f"/v1/streams/{name}/roll")
    r = await api.get(f"/v1/streams/{name}/trainset?model_id={mid}", role="model")
    assert r.status_code == 200 and r.headers["X-Selectivity-Epoch"] == "2"
    out = (await api.get(f"/v1/streams/{name}/models/{mid}", role="model")).json()
    assert out["trained_epoch"] == 2 and out["status"] == "current"
    r = await api.get(f"/v1/streams/{name}/trainset?model_id=m_ffffffffffffffff", role="model")
    assert r.status_code == 404
