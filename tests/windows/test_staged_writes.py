"""Big values reach Redis by plain commands and are moved into place by RENAME (issue 17: no
script or single command holds Redis for a whole aggregate or a window's tables): the moves
keep the old guarantees (a prepared window is never overwritten once open, a reader never
mixes two versions of an aggregate) and leave no staging key behind."""

from __future__ import annotations

import numpy as np
import pytest

from service.core.tables import aggregate as aggregate_mod
from service.core.tables.aggregate import Aggregate
from service.stores import windows as windows_store
from tests.conftest import Api, unique


async def _staged(api: Api, name: str) -> list[bytes]:
    return [k async for k in api.ctx.redis.scan_iter(match=f"*{{{name}*:stage:*")]


async def test_tables_of_an_open_window_are_never_overwritten_and_no_stage_is_left(
    api: Api,
) -> None:
    store = api.ctx.stores.windows
    name = unique("stage")
    first = {1: np.arange(6), 2: -np.arange(6)}
    assert await store.write_tables(name, 1, first, np.array([3, 4]), state="open")
    again = {1: np.full(6, 9), 2: np.full(6, 9)}
    assert not await store.write_tables(name, 1, again, np.array([9, 9]), state="prepared")
    got = await store.read_tables(name, 1, [1, 2], cells=6)
    assert got is not None
    tables, prior = got
    assert tables[1].tolist() == list(range(6)) and tables[2].tolist() == [-i for i in range(6)]
    assert prior.tolist() == [3, 4]
    assert await store.state(name, 1) == "open"
    assert await _staged(api, name) == []
    for key in (api.ctx.keys.table(name, 1, 1), api.ctx.keys.prior(name, 1)):
        assert await api.ctx.redis.ttl(key) == -1  # the staging key's TTL did not come along
    await api.ctx.redis.delete(*[k async for k in api.ctx.redis.scan_iter(match=f"*{name}*")])


async def test_a_window_read_in_steps_is_whole_or_none(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read_window`` reads a few tables per MGET; a table never written reads as zeros, a
    deleted window as None."""
    monkeypatch.setattr(windows_store, "MGET_STEP", 2)
    store = api.ctx.stores.windows
    name = unique("stage")
    tables = {t: np.full(4, t) for t in range(1, 6)}
    await store.write_tables(name, 1, tables, np.array([7, 8]), state="prepared")
    flat = await store.read_window(name, 1, [1, 2, 3, 9, 4, 5], cells=4)
    assert flat is not None
    want = [1] * 4 + [2] * 4 + [3] * 4 + [0] * 4 + [4] * 4 + [5] * 4 + [7, 8]
    assert flat.tolist() == want
    await store.delete_tables(name, 1, list(tables))
    assert await store.read_window(name, 1, [1, 2, 3, 4, 5], cells=4) is None
    await store.delete_meta(name, 1)


async def test_an_aggregate_read_while_it_is_rewritten_is_one_version_whole(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The aggregate is stored in pieces (here 8 bytes each) read one command at a time; a
    rewrite landing between two pieces makes the reader start again, so it gets the new
    version whole, never a mix."""
    monkeypatch.setattr(aggregate_mod, "CHUNK_BYTES", 8)
    store = api.ctx.stores.windows
    name = unique("stage")
    layout = [(1, 5), (2, 5)]
    old = Aggregate(3, 1, 2, [1, 2], layout, np.arange(12, dtype=np.int64))
    new = Aggregate(3, 1, 2, [1, 2], layout, 100 + np.arange(12, dtype=np.int64))
    await store.write_agg(name, old)
    assert len(Aggregate.chunks_of(old.to_redis()["meta"])) == 6
    real = api.ctx.redis.hget
    calls = 0

    async def rewritten_after_the_second_piece(key, field):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 3:
            await store.write_agg(name, new)
        return await real(key, field)

    monkeypatch.setattr(api.ctx.redis, "hget", rewritten_after_the_second_piece)
    got = await store.read_agg(name, 3)
    monkeypatch.setattr(api.ctx.redis, "hget", real)
    assert got is not None and got.cells.tolist() == new.cells.tolist()
    assert calls > 7  # it did start again
    assert await _staged(api, name) == []
    assert await api.ctx.redis.ttl(api.ctx.keys.agg(name, 3)) == -1
    await api.ctx.redis.delete(api.ctx.keys.agg(name, 3))
