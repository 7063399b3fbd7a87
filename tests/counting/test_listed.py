"""Batches listed whole for counting (``Keys.batches``): the counting job reads a run of
them as a few bulk strings instead of an entry per row; entries in no listed batch (written
by a version before the list) and a batch a JSON count stopped inside are read as JSON; every
entry is counted exactly once, and what is counted leaves the list."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.counting import service as counting
from service.stores.counting import CountingStore
from service.stores.ingest import IngestStore
from service.streams import service as streams
from tests.conftest import Api
from tests.counting.tables import expected_tables
from tests.helpers import new_stream, obs


def _batch(k: int, n: int) -> list[dict[str, Any]]:
    return [
        obs(f"u{(k + i) % 11}", f"i{(k * 3 + i) % 17}", 20 + i % 40, str(i % 2)) for i in range(n)
    ]


async def _window(api: Api, name: str) -> np.ndarray:
    rt = await streams.runtime(ctx=api.ctx, name=name)
    flat = await api.ctx.stores.windows.read_window(
        name, 1, [t.id for t in rt.tables], cells=rt.spec.cells
    )
    assert flat is not None
    return flat


async def test_listed_and_unlisted_batches_interleaved_are_each_counted_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = await new_stream(api, "lst")
    real = IngestStore.accept
    listed = iter([True, False, False, True, True, False, True] * 2)

    async def accept(self: IngestStore, **kw: Any) -> Any:
        return await real(self, **{**kw, "listed": next(listed)})

    monkeypatch.setattr(IngestStore, "accept", accept)
    monkeypatch.setattr(counting, "COUNT_CHUNK", 50)
    rows: list[dict[str, Any]] = []
    rt = await streams.runtime(ctx=api.ctx, name=name)
    for k in range(14):
        batch = _batch(k, 7 + 13 * k % 40)
        rows += batch
        r = await api.post(
            f"/v1/streams/{name}/observations", role="producer", json={"observations": batch}
        )
        assert r.status_code == 202
        if k % 5 == 4:  # counted as it goes, as the job does
            await counting.count_window(ctx=api.ctx, rt=rt, window=1)
    assert await counting.count_window(ctx=api.ctx, rt=rt, window=1) > 0
    np.testing.assert_array_equal(await _window(api, name), await expected_tables(api, name, rows))
    assert await api.ctx.redis.llen(api.ctx.keys.batches(name, 1)) == 0  # all popped
    assert await counting.count_window(ctx=api.ctx, rt=rt, window=1) == 0


async def test_a_batch_a_json_count_stopped_inside_is_finished_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A counter that reads JSON only (a version before the list) dies inside a listed batch;
    the next counter reads the rest of that batch as JSON and the following batches listed."""
    name = await new_stream(api, "lsp")
    rows = [o for k in range(4) for o in _batch(k, 60)]
    for k in range(4):
        r = await api.post(
            f"/v1/streams/{name}/observations",
            role="producer",
            json={"observations": rows[60 * k : 60 * (k + 1)]},
        )
        assert r.status_code == 202
    rt = await streams.runtime(ctx=api.ctx, name=name)

    async def json_only(*_: Any) -> tuple[list[tuple[int, int]], int, None, None]:
        return [], 0, None, None

    calls = {"n": 0}
    real = CountingStore.count

    async def dies_on_the_third(self: CountingStore, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise ConnectionError("killed")
        return await real(self, **kw)

    monkeypatch.setattr(counting, "_listed_run", json_only)
    monkeypatch.setattr(counting, "COUNT_CHUNK", 25)
    monkeypatch.setattr(CountingStore, "count", dies_on_the_third)
    with pytest.raises(ConnectionError):
        await counting.count_window(ctx=api.ctx, rt=rt, window=1)  # 50 rows: inside batch 1
    monkeypatch.undo()
    checkpoint = await api.ctx.stores.counting.counted(name, 1)
    assert len(await api.ctx.redis.xrange(api.ctx.keys.hot(name, 1), "-", checkpoint)) == 50
    assert await counting.count_window(ctx=api.ctx, rt=rt, window=1) == 190
    np.testing.assert_array_equal(await _window(api, name), await expected_tables(api, name, rows))
    assert await api.ctx.redis.llen(api.ctx.keys.batches(name, 1)) == 0
