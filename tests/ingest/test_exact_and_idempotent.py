"""Integers that a body cannot hold exactly are refused, the others stay exact (issue 13 item
3); an Idempotency-Key reused with another body is refused, a true retry is not (item 8)."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from service.core.features import hotrows
from service.lifecycle import roll as lifecycle_roll
from service.streams import service as streams
from tests.conftest import Api
from tests.helpers import new_stream, obs, window_cells
from tests.queues.test_queues import make_queue

REUSED = "Idempotency-Key reused with a different request body"


def _with_user(user: Any, n: int = 1) -> dict[str, Any]:
    row = obs("u", "i1", 20, "1")
    row["features"]["user"] = user
    return {"observations": [row] * n}


async def _hot_user_keys(api: Api, name: str, window: int) -> list[bytes]:
    """The canonical key of ``user`` in each hot row of the window, as counting reads it."""
    rt = await streams.runtime(ctx=api.ctx, name=name)
    store = api.ctx.stores.ingest
    keys = []
    for _, fields in await store.r.xrange(store.k.hot(name, window)):
        chunk = hotrows.parse_chunk(fields[b"d"], encode=list(rt.features), passthrough=[])
        user = chunk.encoded["user"]
        keys.append(user.keys[int(user.codes[0])])
    return keys


@pytest.mark.parametrize("value", [2**70, 2**70 + 1, 2**64, -(2**63) - 1, 10**30, -(10**25)])
async def test_integers_beyond_64_bits_are_refused_naming_the_field(api: Api, value: int) -> None:
    name = await new_stream(api, "big")
    body = _with_user(value)
    body["observations"].insert(0, obs("a", "b", 30, "0"))
    r = await api.post(f"/v1/streams/{name}/observations", role="producer", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "observations[1].features.user" in detail and "2^64-1" in detail, detail
    assert str(value) not in detail  # no raw data in errors
    assert (await window_cells(api.ctx, name, 1))["_hot"] in (None, b"0")


async def test_numeric_feature_beyond_64_bits_is_refused_too(api: Api) -> None:
    name = await new_stream(api, "big")
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [{"features": {"age": 10**21}, "label": "1"}]},
    )
    assert r.status_code == 422 and "features.age" in r.json()["detail"], r.text
    # a float literal of the same size is a number, accepted
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        content=b'{"observations": [{"features": {"age": 1e21, "user": "1234567890123456789012"},'
        b' "label": "1"}]}',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 202, r.text


@pytest.mark.parametrize(
    "pair",
    [
        (2**53, 2**53 + 1),  # beyond float64's exact integers
        (2**63 - 2, 2**63 - 1),
        (2**64 - 2, 2**64 - 1),  # the edge of the accepted range
        (-(2**63), -(2**63) + 1),
    ],
)
async def test_integers_within_64_bits_stay_exact_and_distinct(
    api: Api, pair: tuple[int, int]
) -> None:
    name = await new_stream(api, "exact")
    for value in pair:
        r = await api.post(
            f"/v1/streams/{name}/observations", role="producer", json=_with_user(value, 2)
        )
        assert r.status_code == 202, r.text
    keys = await _hot_user_keys(api, name, 1)
    assert keys == [str(pair[0]).encode()] * 2 + [str(pair[1]).encode()] * 2
    # a large identifier sent as a string is the same category as the exact integer
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json=_with_user(str(pair[1]))
    )
    assert (await _hot_user_keys(api, name, 1))[-1] == str(pair[1]).encode()


async def test_key_reused_with_another_body_is_refused_and_drops_nothing_silently(
    api: Api,
) -> None:
    name = await new_stream(api, "idem", hot_windows=2)
    url = f"/v1/streams/{name}/observations"
    h = {"Idempotency-Key": "batch-7"}
    first = {"observations": [obs("u1", "i1", 20, "1")]}
    other = {"observations": [obs("u1", "i1", 20, "0")]}
    r1 = await api.post(url, role="producer", json=first, headers=h)
    assert r1.status_code == 202, r1.text
    r2 = await api.post(url, role="producer", json=other, headers=h)
    assert r2.status_code == 422, r2.text
    assert r2.json()["detail"] == REUSED
    assert "Idempotent-Replayed" not in r2.headers
    # the true retry still answers as before, counted once
    r3 = await api.post(url, role="producer", json=first, headers=h)
    assert r3.status_code == 202 and r3.json() == r1.json()
    assert r3.headers.get("Idempotent-Replayed") == "true"
    assert (await window_cells(api.ctx, name, 1))["_hot"] == b"1"
    # across a roll: the key is found in the earlier window, with its fingerprint
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    r4 = await api.post(url, role="producer", json=other, headers=h)
    assert r4.status_code == 422 and r4.json()["detail"] == REUSED
    r5 = await api.post(url, role="producer", json=first, headers=h)
    assert r5.status_code == 202 and r5.json() == {"accepted": 1, "window": 1}
    assert (await window_cells(api.ctx, name, 2))["_hot"] in (None, b"0")


async def test_racing_requests_with_one_key(api: Api) -> None:
    """Identical racing requests: one accepted, the others replayed, counted once. Racing
    requests with different bodies: exactly one body accepted, the others refused."""
    name = await new_stream(api, "idem")
    url = f"/v1/streams/{name}/observations"
    same = {"observations": [obs("u1", "i1", 20, "1")] * 3}
    rs = await asyncio.gather(
        *[
            api.post(url, role="producer", json=same, headers={"Idempotency-Key": "k-same"})
            for _ in range(6)
        ]
    )
    assert [r.status_code for r in rs] == [202] * 6
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in rs) == 5
    assert (await window_cells(api.ctx, name, 1))["_hot"] == b"3"
    bodies = [{"observations": [obs(f"u{j}", "i1", 20, "1")] * (j + 1)} for j in range(6)]
    rs = await asyncio.gather(
        *[
            api.post(url, role="producer", json=b, headers={"Idempotency-Key": "k-diff"})
            for b in bodies
        ]
    )
    ok = [j for j, r in enumerate(rs) if r.status_code == 202]
    assert len(ok) == 1 and all(
        r.status_code == 422 and r.json()["detail"] == REUSED for r in rs if r.status_code != 202
    )
    assert (await window_cells(api.ctx, name, 1))["_hot"] == str(3 + ok[0] + 1).encode()


async def test_racing_identical_requests_across_a_roll(api: Api) -> None:
    """A retry racing a roll lands in one window only, and is never refused as a reuse."""
    name = await new_stream(api, "idem", hot_windows=3, retention_windows=20)
    url = f"/v1/streams/{name}/observations"
    body = {"observations": [obs("u1", "i1", 20, "1")] * 2}

    async def rolls() -> None:
        for _ in range(3):
            await lifecycle_roll.roll(ctx=api.ctx, name=name)
            await asyncio.sleep(0)

    h = {"Idempotency-Key": "k"}
    results = await asyncio.gather(
        *[api.post(url, role="producer", json=body, headers=h) for _ in range(8)], rolls()
    )
    rs = [r for r in results if r is not None]
    assert all(r.status_code == 202 for r in rs), [r.text for r in rs]
    assert len({r.json()["window"] for r in rs}) == 1
    total = 0
    for w in range(1, 5):
        total += int((await window_cells(api.ctx, name, w))["_hot"] or 0)
    assert total == 2


async def test_a_key_stored_before_fingerprints_is_still_a_retry(api: Api) -> None:
    """Keys written by the previous version (the response alone) stay retries after an
    upgrade: no 422 for a client retrying across it, and no second acceptance."""
    name = await new_stream(api, "idem")
    store = api.ctx.stores.ingest
    token = hashlib.sha256(b"old-key").hexdigest()
    await store.r.set(store.k.idem(name, 1, token), b'{"accepted":5,"window":1}', ex=600)
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [obs("u1", "i1", 20, "1")]},
        headers={"Idempotency-Key": "old-key"},
    )
    assert r.status_code == 202 and r.json() == {"accepted": 5, "window": 1}
    assert r.headers.get("Idempotent-Replayed") == "true"
    assert (await window_cells(api.ctx, name, 1))["_hot"] in (None, b"0")


async def test_featurize_predict_and_candidates_refuse_them_too(api: Api) -> None:
    """An integer beyond 64 bits would be a rounded float there: it could only miss the value
    ingest stored, or collide with another; refused the same way, naming the field."""
    name = await new_stream(api, "big")
    big = 2**70
    rows = [{"user": "a"}, {"user": big}]
    for path in ("featurize", "predict"):
        r = await api.post(f"/v1/streams/{name}/{path}", role="model", json={"rows": rows})
        assert r.status_code == 422, (path, r.text)
        detail = r.json()["detail"]
        assert "rows[1].user" in detail and "2^64-1" in detail and str(big) not in detail
    await api.add_keys(curator="curator")
    queue = await make_queue(api, payload_kind="record", stream=name, labels=None)
    candidates = [{"record": {"x": 1}}, {"record": {"x": big}}]
    r = await api.post(f"/v1/queues/{queue}/candidates", "curator", json={"candidates": candidates})
    assert r.status_code == 422, r.text
    assert "candidates[1].record.x" in r.json()["detail"]
