"""Exact per-window statistics (issue 12, item 2; docs/PRIVACY.md, promise 1): a window's
observation count is shown only while the window is in the hot period, and is never stored."""

from __future__ import annotations

from sqlalchemy import select, text

from service.db.models import Stream
from tests.conftest import Api
from tests.helpers import ingest, new_stream, obs


async def test_observation_counts_are_shown_only_while_the_window_is_hot(api: Api) -> None:
    name = await new_stream(api, "stats", hot_windows=2)
    await ingest(api, name, [obs("u", "i", 30, "1")] * 3)
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200  # epoch 2: [1, 2]
    await ingest(api, name, [obs("u", "i", 30, "0")] * 2)

    async def shown() -> dict[int, tuple[str, int | None]]:
        r = await api.get(f"/v1/streams/{name}/windows", role="model")
        assert r.status_code == 200, r.text
        return {w["epoch"]: (w["period"], w["observations"]) for w in r.json()["windows"]}

    assert await shown() == {2: ("open", 2), 1: ("hot", 3)}
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200  # epoch 3: [2, 3]
    # window 1 left the hot period (its raw rows wait in Redis for the seal): no count
    assert await shown() == {3: ("open", 0), 2: ("hot", 2), 1: ("count", None)}
    assert await api.ctx.stores.windows.hot_length(name, 1) == 3
    async with api.ctx.sessionmaker() as session:
        sid = await session.scalar(select(Stream.id).where(Stream.name == name))
        row = (
            await session.execute(
                text("SELECT * FROM stream_window WHERE stream_id = :s AND epoch = 1"), {"s": sid}
            )
        ).one()
    assert "observations" not in row._fields  # SQL keeps no count of any window
