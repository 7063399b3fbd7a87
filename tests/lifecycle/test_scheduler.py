"""The scheduler tick (``service.lifecycle.scheduler``, the worker's ``windows_tick`` job)."""

from __future__ import annotations

from datetime import timedelta

from service.streams import repository
from tests.conftest import Api
from tests.helpers import new_stream
from workers.jobs import windows_tick


async def test_worker_tick_rolls_due_streams_and_prepares_the_next_window(api: Api) -> None:
    name = await new_stream(api, "win", window_seconds=1)
    ctx = api.ctx
    async with ctx.sessionmaker() as session, session.begin():  # its open window is 2 s old
        stream = await repository.get_by_name(session, name)
        assert stream is not None
        stream.epoch_started_at -= timedelta(seconds=2)
    result = await windows_tick({"app": ctx})
    assert result["rolled"] >= 1
    assert await ctx.stores.windows.epoch(name) == 2
    assert await ctx.stores.windows.state(name, 3) == "prepared"
