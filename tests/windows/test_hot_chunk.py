"""``WindowStore.hot_chunk`` reads in steps of ``HOT_STEP`` entries (Redis serves others in
between) and gives what one read of the whole range gives."""

from __future__ import annotations

import pytest

from service.stores import windows as store_module
from tests.conftest import Api
from tests.helpers import ingest, new_stream, obs


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
async def test_reading_in_steps_gives_the_same_chunk(
    api: Api, monkeypatch: pytest.MonkeyPatch, step: int
) -> None:
    name = await new_stream(api, "hc")
    await ingest(api, name, [obs(f"u{i}", "i", 20 + i, str(i % 2)) for i in range(20)])
    store = api.ctx.stores.windows
    whole = await store.hot_chunk(name, 1, "-", "+", 1000)
    assert whole is not None and whole[1] == 20
    monkeypatch.setattr(store_module, "HOT_STEP", step)
    assert await store.hot_chunk(name, 1, "-", "+", 1000) == whole
    first = await store.hot_chunk(name, 1, "-", "+", 8)  # a count that is not a whole step
    assert first is not None and first[1] == 8
    rest = await store.hot_chunk(name, 1, b"(" + first[0], "+", 1000)
    assert rest is not None and rest[1] == 12 and rest[0] == whole[0]
    assert first[2] + b"," + rest[2] == whole[2]
    assert await store.hot_chunk(name, 1, b"(" + whole[0], "+", 1000) is None
