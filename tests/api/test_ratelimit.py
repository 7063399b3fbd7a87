"""Per-key rate limits and creation caps (service.api.ratelimit): every operation is either
limited by its class's token bucket or a lookup; a key past its limit gets 429 with
Retry-After naming the limit, before its body is read, and other keys and classes are not
affected; a key at its stream or queue cap gets 403 naming the setting, and a failed creation
gives its slot back."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI

from service.api import ratelimit
from service.config import RATE_LIMITS, Settings
from tests.conftest import Api, unique
from tests.helpers import stream_body

PLAN = {
    "observations_per_window": 5000,
    "cardinalities": {"user": 5000, "item": 1700},
    "target_loss": 1.03,
}


def _set(api: Api, monkeypatch: pytest.MonkeyPatch, **over: object) -> None:
    settings = Settings(**{**api.ctx.settings.model_dump(), **over})  # type: ignore[arg-type]
    monkeypatch.setattr(api.ctx, "settings", settings)


def test_every_operation_is_limited_or_a_lookup(default_app: FastAPI) -> None:
    doc = default_app.openapi()
    ops = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    unclassified = ops - set(ratelimit.CLASSES) - ratelimit.LOOKUPS
    assert not unclassified, f"add them to CLASSES or LOOKUPS: {sorted(unclassified)}"
    assert not (set(ratelimit.CLASSES) | ratelimit.LOOKUPS) - ops  # no stale entry
    assert set(ratelimit.CLASSES.values()) == set(RATE_LIMITS)
    for method, path in ratelimit.CLASSES:
        op = doc["paths"][path][method.lower()]
        assert "429" in op["responses"] and op.get("security"), (method, path)
    for method, path in ratelimit.LOOKUPS:
        assert "429" not in doc["paths"][path][method.lower()]["responses"]


async def test_past_the_limit_429_with_retry_after(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    _set(api, monkeypatch, rate_limits="compute=3/60")
    for _ in range(3):
        assert (await api.post("/v1/privacy/plan", "analyst", json=PLAN)).status_code == 200
    r = await api.post("/v1/privacy/plan", "analyst", json=PLAN)
    assert r.status_code == 429, r.text
    assert r.json()["error"] == "TooManyRequests"
    detail = r.json()["detail"]
    assert "'compute'" in detail and "3 per 60 s" in detail and "SELECTIVITY_RATE_LIMITS" in detail
    retry = r.headers["retry-after"]
    assert retry.isascii() and retry.isdigit() and 1 <= int(retry) <= 20  # a token per 20 s
    # refused before the body is read: a broken body is not even parsed
    r = await api.post(
        "/v1/privacy/plan",
        "analyst",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 429
    # another class of the same key, and the same class for another key, are not affected
    assert (await api.get("/v1/streams", "analyst")).status_code == 200
    assert (await api.post("/v1/privacy/plan", "producer", json=PLAN)).status_code == 200
    # without a key it is still a 401, not a 429
    assert (await api.client.post("/v1/privacy/plan", json=PLAN)).status_code == 401


async def test_a_burst_of_concurrent_requests_gets_exactly_the_bucket(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    _set(api, monkeypatch, rate_limits="compute=5/3600")
    rs = await asyncio.gather(
        *(api.post("/v1/privacy/plan", "analyst", json=PLAN) for _ in range(12))
    )
    assert sorted(r.status_code for r in rs) == [200] * 5 + [429] * 7


async def test_a_class_turned_off_is_not_limited(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    _set(api, monkeypatch, rate_limits="compute=off")
    assert api.ctx.settings.rate_limit_table["compute"] is None
    for _ in range(3):
        assert (await api.post("/v1/privacy/plan", "analyst", json=PLAN)).status_code == 200
    assert await api.ctx.redis.exists(api.ctx.keys.rate("x", "compute")) == 0


async def test_the_bucket_refills(api: Api) -> None:
    """The store: a bucket of 2 refilled every 50 ms admits 2 at once, then says how long to
    wait (at most one interval), then admits again once that time has passed."""
    store = api.ctx.stores.quotas
    key = unique("k")
    assert await store.take(key_id=key, cls="serve", interval_us=50_000, burst=2) == 0
    assert await store.take(key_id=key, cls="serve", interval_us=50_000, burst=2) == 0
    wait = await store.take(key_id=key, cls="serve", interval_us=50_000, burst=2)
    assert 0 < wait <= 50_000
    await asyncio.sleep(wait / 1_000_000 + 0.01)
    assert await store.take(key_id=key, cls="serve", interval_us=50_000, burst=2) == 0
    ttl = await api.ctx.redis.pttl(api.ctx.keys.rate(key, "serve"))
    assert 0 < ttl <= 200  # the key goes when the bucket would be full again


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("compute=0/60", "compute='0/60' must be <requests>/<seconds>"),
        ("compute=5/0", "compute='5/0' must be"),
        ("compute=lots", "compute='lots' must be"),
        ("reads=5/1", "unknown class 'reads'"),
    ],
)
def test_bad_rate_limits_are_named(value: str, message: str) -> None:
    with pytest.raises(ValueError, match="RATE_LIMITS") as e:
        Settings(rate_limits=value)
    assert message in str(e.value)


async def test_a_key_at_its_stream_cap_is_refused(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    _set(api, monkeypatch, max_streams_per_key=2)
    first = unique("cap")
    assert (await api.post("/v1/streams", json=stream_body(first))).status_code == 201
    # a failed creation (the name is taken) gives its slot back
    assert (await api.post("/v1/streams", json=stream_body(first))).status_code == 409
    assert (await api.post("/v1/streams", json=stream_body(unique("cap")))).status_code == 201
    r = await api.post("/v1/streams", json=stream_body(unique("cap")))
    assert r.status_code == 403, r.text
    assert r.json()["error"] == "QuotaExceeded"
    assert r.json()["detail"] == (
        "this key has created 2 streams, its limit (SELECTIVITY_MAX_STREAMS_PER_KEY = 2)"
    )
    # another key has its own count
    await api.add_keys(admin2="admin")
    r = await api.post("/v1/streams", "admin2", json=stream_body(unique("cap")))
    assert r.status_code == 201


async def test_concurrent_creations_never_pass_the_queue_cap(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    _set(api, monkeypatch, max_queues_per_key=3)
    await api.add_keys(curator="curator")
    bodies = [{"name": unique("qc"), "beta": 0.1, "k": 20, "labels": ["a", "b"]} for _ in range(6)]
    rs = await asyncio.gather(*(api.post("/v1/queues", "curator", json=b) for b in bodies))
    assert sorted(r.status_code for r in rs) == [201] * 3 + [403] * 3
    refused = next(r for r in rs if r.status_code == 403)
    assert "SELECTIVITY_MAX_QUEUES_PER_KEY = 3" in refused.json()["detail"]


async def test_featurize_is_limited_in_process_without_a_redis_round_trip(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``serve`` class (featurize, predict) keeps its buckets in the API process: the same
    429 past the limit, and no bucket in Redis."""
    _set(api, monkeypatch, rate_limits="serve=2/3600")
    api.ctx.caches.rate_buckets.clear()
    name = unique("rlserve")
    body = {
        "name": name,
        "features": [{"name": "a"}],
        "labels": ["0", "1"],
        "sketch": {"width": 64, "depth": 2},
        "privacy": {"mechanism": "none"},
    }
    assert (await api.post("/v1/streams", "admin", json=body)).status_code == 201
    url = f"/v1/streams/{name}/featurize"
    rows = {"rows": [{"a": "x"}]}
    assert [(await api.post(url, "model", json=rows)).status_code for _ in range(2)] == [200, 200]
    r = await api.post(url, "model", json=rows)
    assert r.status_code == 429 and "'serve'" in r.json()["detail"], r.text
    assert int(r.headers["retry-after"]) >= 1
    assert await api.ctx.redis.keys(api.ctx.keys.rate("*", "serve")) == []
    assert len(api.ctx.caches.rate_buckets) == 1
