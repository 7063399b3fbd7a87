"""The real SAQ worker, cron included, rolls a due stream on its own."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import Api, unique
from tests.helpers import cancel_and_wait, stream_body
from workers.runner import cron_every, run_in_process


def test_cron_every() -> None:
    assert cron_every(5) == "* * * * * */5"
    assert cron_every(0.2) == "* * * * * */1"
    assert cron_every(600) == "* * * * * */59"


@pytest.mark.slow  # the real SAQ worker, polled for up to 120 s
async def test_worker_rolls_a_due_stream_by_itself(api: Api) -> None:
    ctx = api.ctx
    ctx.settings = ctx.settings.model_copy(update={"scheduler_seconds": 1})
    name = unique("cron")
    assert (
        await api.post("/v1/streams", json=stream_body(name, window_seconds=1))
    ).status_code == 201
    worker = asyncio.create_task(run_in_process(ctx))
    try:
        # up to 120 s (a hang guard, not a timing): the tick walks every stream of the
        # session, and in the full suite on a loaded machine that took over 30 s once
        for _ in range(1200):
            await asyncio.sleep(0.1)
            if (await ctx.stores.windows.epoch(name) or 0) >= 2:
                break
        assert (await ctx.stores.windows.epoch(name) or 0) >= 2
    finally:
        await cancel_and_wait(worker)
