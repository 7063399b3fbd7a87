"""The ``served`` pointer cached per API process (``service.features.pointer``): a roll in
another process reaches it by message, featurize then costs no Redis read, and without the
subscription every request reads the pointer again."""

from __future__ import annotations

import asyncio

import pytest

from service.features import pointer
from service.features import service as features
from service.lifecycle import roll as lifecycle_roll
from tests.conftest import Api, Backend, app_context
from tests.helpers import ingest, new_stream, obs

PROBE = [{"user": "alice", "item": "x", "age": 20}]


async def _until(check, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


@pytest.fixture(autouse=True)
def _no_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cached values never go stale by age here: only messages may refresh them."""
    monkeypatch.setattr(pointer, "FRESH_SECONDS", 3600.0)


async def test_a_roll_elsewhere_reaches_the_cache_and_reads_stop(
    api: Api, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = await new_stream(api, "ptr")
    await ingest(api, name, [obs("alice", "x", 20, "1")])
    async with app_context(backend.settings, backend.embedded) as other:  # a second process
        assert (await features.featurize(ctx=other, name=name, rows=PROBE))["epoch"] == 1
        cache = pointer._cache(other)
        await _until(lambda: cache.live, "the subscription was not confirmed")
        await features.featurize(ctx=other, name=name, rows=PROBE)  # cached now

        reads: list[str] = []
        real = other.stores.windows.served

        async def counted(s: str) -> int | None:
            reads.append(s)
            return await real(s)

        monkeypatch.setattr(other.stores.windows, "served", counted)
        for _ in range(5):
            assert (await features.featurize(ctx=other, name=name, rows=PROBE))["epoch"] == 1
        assert reads == []

        assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2  # in the first process
        await _until(lambda: cache.epochs.get(name, (0, 0))[1] == 2, "the move did not arrive")
        assert (await features.featurize(ctx=other, name=name, rows=PROBE))["epoch"] == 2
        assert reads == []


async def test_without_the_subscription_every_request_reads(api: Api, backend: Backend) -> None:
    name = await new_stream(api, "ptr")
    await ingest(api, name, [obs("alice", "x", 20, "1")])
    async with app_context(backend.settings, backend.embedded) as other:
        await features.featurize(ctx=other, name=name, rows=PROBE)
        cache = pointer._cache(other)
        await _until(lambda: cache.live, "the subscription was not confirmed")
        watcher = other.caches.background["served-watch"]
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        assert not cache.live and cache.epochs == {}
        # a roll whose message nobody receives: the next request still sees it
        assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
        assert (await features.featurize(ctx=other, name=name, rows=PROBE))["epoch"] == 2


async def test_a_dropped_subscription_is_taken_up_again(api: Api, backend: Backend) -> None:
    name = await new_stream(api, "ptr")
    await ingest(api, name, [obs("alice", "x", 20, "1")])
    async with app_context(backend.settings, backend.embedded) as other:
        await features.featurize(ctx=other, name=name, rows=PROBE)
        cache = pointer._cache(other)
        await _until(lambda: cache.live, "the subscription was not confirmed")
        await other.redis.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        # until it is back, the cache is not used; once back, it starts empty
        assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
        assert (await features.featurize(ctx=other, name=name, rows=PROBE))["epoch"] == 2
        await asyncio.sleep(pointer.RETRY_SECONDS + 0.2)
        await _until(lambda: cache.live, "the subscription did not come back")
        assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 3
        await _until(lambda: cache.epochs.get(name, (0, 0))[1] == 3, "the move did not arrive")
        assert (await features.featurize(ctx=other, name=name, rows=PROBE))["epoch"] == 3
