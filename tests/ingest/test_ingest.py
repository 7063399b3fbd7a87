"""Accepting batches (``service.ingest``): the window a batch lands in, idempotent retries,
batches racing rolls, validation, limits and roles. Counting them is ``tests/counting``'s."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from service.lifecycle import roll as lifecycle_roll
from tests.conftest import Api
from tests.helpers import new_stream, obs, prior_of, window_cells


async def test_ingest_counts_and_appends(api: Api) -> None:
    name = await new_stream(api, "ing")
    batch = [obs("u1", "i1", 20, "1", "a"), obs("u1", "i2", 30, "0"), obs("u2", "i1", 40, "1")]
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": batch}
    )
    assert r.status_code == 202, r.text
    assert r.json() == {"accepted": 3, "window": 1}
    cells = await window_cells(api.ctx, name, 1)
    assert cells["_hot"] == b"3"
    np.testing.assert_array_equal(prior_of(cells["_prior"]), [1, 2])  # mechanism none: exact


async def test_idempotent_retry_never_double_counts_even_after_a_roll(api: Api) -> None:
    name = await new_stream(api, "ing", hot_windows=2)
    body = {"observations": [obs("u1", "i1", 20, "1"), obs("u2", "i2", 50, "0")]}
    h = {"Idempotency-Key": "batch-42"}
    r1 = await api.post(f"/v1/streams/{name}/observations", role="producer", json=body, headers=h)
    before = await window_cells(api.ctx, name, 1)
    r2 = await api.post(f"/v1/streams/{name}/observations", role="producer", json=body, headers=h)
    assert r2.status_code == 202 and r2.json() == r1.json()
    assert r2.headers.get("Idempotent-Replayed") == "true"
    assert await window_cells(api.ctx, name, 1) == before
    # the stream rolls; the retry must not land again in window 2
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    r3 = await api.post(f"/v1/streams/{name}/observations", role="producer", json=body, headers=h)
    assert r3.json() == {"accepted": 2, "window": 1}
    assert (await window_cells(api.ctx, name, 2))["_hot"] == b"0"
    assert await window_cells(api.ctx, name, 1) == before
    # a different key is a different batch
    r4 = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json=body,
        headers={"Idempotency-Key": "batch-43"},
    )
    assert r4.json() == {"accepted": 2, "window": 2}


async def test_batch_racing_a_roll_lands_in_the_next_window(api: Api) -> None:
    name = await new_stream(api, "ing")
    ctx = api.ctx
    # this process believes window 1 is open (cached) ...
    await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [obs("u", "i", 20, "1")]},
    )
    assert ctx.caches.open_epochs[name] == 1
    # ... while another process rolls the stream

    assert await lifecycle_roll.roll(ctx=ctx, name=name) == 2
    ctx.caches.open_epochs[name] = 1  # as if the roll happened elsewhere
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [obs("u", "i", 20, "0")]},
    )
    assert r.json() == {"accepted": 1, "window": 2}
    assert (await window_cells(ctx, name, 1))["_hot"] == b"1"
    assert (await window_cells(ctx, name, 2))["_hot"] == b"1"


async def test_concurrent_batches_and_rolls_lose_and_double_count_nothing(api: Api) -> None:
    name = await new_stream(api, "ing", retention_windows=50)

    async def producer(k: int) -> int:
        total = 0
        for j in range(15):
            r = await api.post(
                f"/v1/streams/{name}/observations",
                role="producer",
                json={"observations": [obs(f"u{k}", f"i{j}", 30, "1")] * 3},
                headers={"Idempotency-Key": f"p{k}-{j}"},
            )
            assert r.status_code == 202, r.text
            total += r.json()["accepted"]
        return total

    async def roller() -> None:
        for _ in range(4):
            await lifecycle_roll.roll(ctx=api.ctx, name=name)
            await asyncio.sleep(0)

    results = await asyncio.gather(producer(0), producer(1), producer(2), roller())
    sent = sum(r for r in results if r)
    epoch = await api.ctx.stores.windows.epoch(name)
    assert epoch == 5
    hot = prior = 0
    for w in range(1, epoch + 1):
        cells = await window_cells(api.ctx, name, w)
        hot += int(cells["_hot"] or 0)
        prior += int(prior_of(cells["_prior"]).sum())
    assert hot == sent == prior == 3 * 15 * 3


@pytest.mark.parametrize(
    ("observation", "status", "needle"),
    [
        ({"features": {"nope": "x"}, "label": "1"}, 422, "nope"),
        ({"features": {"user": "u"}, "label": "7"}, 422, "label"),
        ({"features": {"user": "u" * 300}, "label": "1"}, 422, "256"),
        ({"features": {"age": "old"}, "label": "1"}, 422, "numeric"),
        ({"features": {"user": {"a": 1}}, "label": "1"}, 422, "user"),
        ({"features": {"user": "u"}}, 422, "label"),
        ({"features": {"user": "u"}, "label": "1", "event_time": "yesterday"}, 422, "event_time"),
        ({"features": {"user": "u"}, "label": "1", "extra": 1}, 422, "extra"),
    ],
)
async def test_bad_observations_are_refused_and_change_nothing(
    api: Api, observation: dict, status: int, needle: str
) -> None:
    name = await new_stream(api, "ing")
    good = obs("u", "i", 20, "1")
    before = await window_cells(api.ctx, name, 1)
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [good, observation]},
    )
    assert r.status_code == status, r.text
    assert r.json()["error"] == "ValidationError"
    assert needle in r.json()["detail"]
    assert await window_cells(api.ctx, name, 1) == before


async def test_limits_and_auth(api: Api) -> None:
    name = await new_stream(api, "ing")
    limit = api.ctx.settings.max_batch
    before = await window_cells(api.ctx, name, 1)
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [obs("u", "i", 20, "1")] * (limit + 1)},
    )
    assert r.status_code == 413 and str(limit) in r.json()["detail"]
    big = {"observations": [obs("u" * 200, "i", 20, "1")] * 20000}
    r = await api.post(f"/v1/streams/{name}/observations", role="producer", json=big)
    assert r.status_code == 413 and r.json()["error"] == "PayloadTooLarge"
    for bad in (
        b"{not json",
        b'{"observations": [{"features": {"age": NaN}, "label": "1"}]}',
        b'{"observations": [{"features": {"age": 1e999999}, "label": "1"}]}',
        b'{"observations": [{"features": {"user": "\xff"}, "label": "1"}]}',
    ):
        r = await api.post(
            f"/v1/streams/{name}/observations",
            role="producer",
            content=bad,
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 422, (bad, r.text)
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="model",
        json={"observations": [obs("u", "i", 20, "1")]},
    )
    assert r.status_code == 403
    r = await api.post(
        "/v1/streams/nope/observations",
        role="producer",
        json={"observations": [obs("u", "i", 20, "1")]},
    )
    assert r.status_code == 404
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": []}
    )
    assert r.status_code == 422
    assert await window_cells(api.ctx, name, 1) == before
