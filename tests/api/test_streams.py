from __future__ import annotations

import pytest

from service.config import Settings
from tests.conftest import Api, unique
from tests.helpers import stream_body


async def test_create_stream_documents_defaults_and_sensitivity(api: Api) -> None:
    name = unique("s")
    r = await api.post(
        "/v1/streams", json={"name": name, "features": [{"name": "a"}], "labels": ["0", "1"]}
    )
    assert r.status_code == 201, r.text
    s = r.json()
    assert s["window_seconds"] == 86400 and s["hot_windows"] == 2
    assert s["retention_windows"] == 30
    assert s["privacy"]["mechanism"] == "laplace" and s["privacy"]["epsilon"] == 1.0
    assert s["sketch"] == {"width": 16384, "depth": 5}
    assert s["max_tables"] == 1 + 1  # selection off: no slot for selected groups
    # Δ1 = T·depth, b = Δ1/ε
    assert s["l1_sensitivity"] == 2 * 5
    assert s["noise_scale"] == pytest.approx(10.0)
    assert s["epoch"] == 1
    assert [t["name"] for t in s["tables"]] == ["a"]

    r = await api.get(f"/v1/streams/{name}", role="model")
    assert r.status_code == 200 and r.json()["name"] == name
    r = await api.get("/v1/streams", role="producer")
    assert name in [x["name"] for x in r.json()["streams"]]


async def test_duplicate_stream_is_409(api: Api) -> None:
    body = stream_body(unique("dup"))
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == 409 and r.json()["error"] == "Conflict"


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"features": [{"name": "x", "kind": "numeric"}]}, "buckets"),
        ({"features": [{"name": "x", "kind": "numeric", "buckets": [3, 1]}]}, "increasing"),
        ({"sketch": {"width": 1000}}, "power of two"),
        ({"labels": ["1"]}, "labels"),
        ({"labels": ["a", "a"]}, "distinct"),
        ({"name": "Bad Name"}, "name"),
        ({"hot_windows": 0}, "hot_windows"),
        ({"max_tables": 2}, "max_tables"),
        ({"privacy": {"mechanism": "laplace", "rho": 1}}, "rho"),
        ({"privacy": {"epsilon": -1}}, "epsilon"),
        ({"bogus": 1}, "bogus"),
        ({"features": [{"name": "a"}, {"name": "a"}]}, "duplicate"),
        ({"window_seconds": "soon"}, "window_seconds"),
        ({"privacy": {"epsilon": 1e-6}}, "noise scale"),
    ],
)
async def test_invalid_stream_bodies_get_422_naming_the_field(
    api: Api, patch: dict, needle: str
) -> None:
    body = stream_body(unique("bad"))
    body.update(patch)
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "ValidationError"
    assert needle in body["detail"]


async def test_keys_and_roles(api: Api) -> None:
    r = await api.client.get("/v1/streams")
    assert r.status_code == 401 and r.json()["error"] == "Unauthorized"
    r = await api.client.get("/v1/streams", headers={"Authorization": "Bearer sk_nope_" + "x" * 40})
    assert r.status_code == 401
    r = await api.client.get("/v1/streams", headers={"Authorization": "Basic abc"})
    assert r.status_code == 401
    r = await api.post("/v1/streams", role="producer", json=stream_body(unique("s")))
    assert r.status_code == 403 and "admin" in r.json()["detail"]
    r = await api.get("/v1/streams/does-not-exist", role="model")
    assert r.status_code == 404 and r.json()["error"] == "NotFound"


async def test_health_and_openapi(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.get("/v1/streams/does-not-exist", role="model")
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    assert (await api.client.get("/readyz")).status_code == 200
    spec = (await api.client.get("/openapi.json")).json()
    assert "/v1/streams/{stream}/observations" in spec["paths"]
    token = "t" * 32  # /metrics answers only the metrics token (tests/test_metrics.py)
    over = {**api.ctx.settings.model_dump(), "metrics_token": token}
    monkeypatch.setattr(api.ctx, "settings", Settings(**over))
    text = (await api.client.get("/metrics", headers={"Authorization": f"Bearer {token}"})).text
    # requests are counted per route template and status (raw paths would leak names)
    assert 'selectivity_requests_total{route="/v1/streams/{stream}",status="404"}' in text
    assert 'selectivity_requests_total{route="/healthz",status="200"}' in text


async def test_a_failed_creation_leaves_nothing_that_breaks_the_next(api: Api) -> None:
    """Redis state left by a creation whose SQL transaction failed must not break a later
    creation of the same name (whose tables get other ids)."""

    name = unique("again")
    store = api.ctx.stores.windows
    await store.set_state(name, 1, "open")  # a leftover: open window 1 without our tables
    await store.set_epoch(name, 7)
    r = await api.post("/v1/streams", json=stream_body(name))
    assert r.status_code == 201
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [{"features": {"user": "u"}, "label": "1"}]},
    )
    assert r.status_code == 202 and r.json()["window"] == 1
