"""An API process loads the next epoch's featurizer as soon as its aggregate is built ahead of
the roll (hot_windows ≥ 2), so the first featurize after the roll answers from memory."""

from __future__ import annotations

import asyncio

import pytest

from service.features import service as features
from service.lifecycle import roll as lifecycle_roll
from tests.conftest import Api, Jobs
from tests.helpers import column, featurize, ingest, new_stream, obs

PROBE = [{"user": "alice", "item": "x", "age": 20}]


async def _loaded_ahead(api: Api, name: str, epoch: int) -> None:
    for _ in range(100):
        ahead = api.ctx.caches.featurizers_ahead.get(name)
        if ahead is not None and ahead[0] == epoch and ahead[1].done():
            assert ahead[1].result().epoch == epoch
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the featurizer of epoch {epoch} was not loaded ahead")


async def test_the_first_featurize_after_a_roll_needs_no_read(
    api: Api, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(features, "AHEAD_POLL_SECONDS", 0.02)
    name = await new_stream(api, "ahead", hot_windows=2)
    await ingest(api, name, [obs("alice", "x", 20, "1")] * 3)  # window 1
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
    await jobs()  # builds the aggregate of epoch 3: window 1
    assert (await featurize(api, name, PROBE))["epoch"] == 2
    await _loaded_ahead(api, name, 3)

    store = api.ctx.stores.windows
    reads: list[int] = []
    real = store.read_agg

    async def counted(s: str, epoch: int):  # type: ignore[no-untyped-def]
        reads.append(epoch)
        return await real(s, epoch)

    monkeypatch.setattr(store, "read_agg", counted)
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 3
    out = await featurize(api, name, PROBE)
    assert out["epoch"] == 3 and column(out, "user:count:1")[0] == 3.0
    assert reads == []


async def test_without_an_aggregate_ahead_the_first_featurize_reads_it(
    api: Api, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(features, "AHEAD_POLL_SECONDS", 0.02)
    name = await new_stream(api, "ahead", hot_windows=1)
    await ingest(api, name, [obs("alice", "x", 20, "1")] * 2)
    assert (await featurize(api, name, PROBE))["epoch"] == 1
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
    await jobs()
    await asyncio.sleep(0.1)
    assert name not in api.ctx.caches.featurizers_ahead  # nothing was loaded ahead
    out = await featurize(api, name, PROBE)
    assert out["epoch"] == 2 and column(out, "user:count:1")[0] == 2.0
