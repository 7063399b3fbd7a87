"""The ``served`` pointer cached per API process (``service.features.pointer``): within
``FRESH_SECONDS`` featurize reads no pointer from Redis, a roll in another process is seen once
the cached value is older than that, and a roll in this process at once."""

from __future__ import annotations

import asyncio

import pytest

from service.features import pointer
from service.features import service as features
from service.lifecycle import roll as lifecycle_roll
from tests.conftest import Api, Backend, app_context
from tests.helpers import ingest, new_stream, obs

PROBE = [{"user": "alice", "item": "x", "age": 20}]


async def test_a_fresh_pointer_costs_no_read_and_an_old_one_is_read_again(
    api: Api, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pointer, "FRESH_SECONDS", 3600.0)
    name = await new_stream(api, "ptr")
    await ingest(api, name, [obs("alice", "x", 20, "1")])
    async with app_context(backend.settings, backend.embedded) as other:  # a second process
        assert (await features.featurize(ctx=other, name=name, rows=PROBE))["epoch"] == 1
        ahead = other.caches.background.pop(f"ahead:{name}")  # it polls the pointer itself
        ahead.cancel()
        await asyncio.gather(ahead, return_exceptions=True)
        monkeypatch.setattr(features, "_load_ahead_soon", lambda *_: None)
        reads: list[str] = []
        real = other.stores.windows.served

        async def counted(s: str) -> int | None:
            reads.append(s)
            return await real(s)

        monkeypatch.setattr(other.stores.windows, "served", counted)
        assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2  # elsewhere
        for _ in range(5):  # within the freshness window: the cached epoch, no read
            assert (await features.featurize(ctx=other, name=name, rows=PROBE))["epoch"] == 1
        assert reads == []
        monkeypatch.setattr(pointer, "FRESH_SECONDS", 0.05)
        await asyncio.sleep(0.06)
        assert (await features.featurize(ctx=other, name=name, rows=PROBE))["epoch"] == 2
        assert reads == [name]


async def test_a_roll_in_this_process_is_seen_at_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pointer, "FRESH_SECONDS", 3600.0)
    name = await new_stream(api, "ptr")
    await ingest(api, name, [obs("alice", "x", 20, "1")])
    assert (await features.featurize(ctx=api.ctx, name=name, rows=PROBE))["epoch"] == 1
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
    assert (await features.featurize(ctx=api.ctx, name=name, rows=PROBE))["epoch"] == 2


async def test_a_process_drops_the_featurizer_of_an_epoch_no_longer_served(
    api: Api, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process rolls the stream and this one gets no request for it: its featurizer of
    the previous epoch (an aggregate with a window that has left the count period) goes at its
    next sweep, not at its next request; the served one stays."""
    monkeypatch.setattr(features, "_load_ahead_soon", lambda *_: None)
    name = await new_stream(api, "swp")
    await ingest(api, name, [obs("alice", "x", 20, "1")])
    async with app_context(backend.settings, backend.embedded) as other:  # a second process
        assert (await features.featurize(ctx=other, name=name, rows=PROBE))["epoch"] == 1
        assert await features.drop_stale(other) == 0  # served: kept
        assert name in other.caches.featurizers
        assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2  # elsewhere
        assert await features.drop_stale(other) == 1
        assert name not in other.caches.featurizers
        assert (await features.featurize(ctx=other, name=name, rows=PROBE))["epoch"] == 2
        assert await features.drop_stale(other) == 0
        assert other.caches.featurizers[name][1].epoch == 2
