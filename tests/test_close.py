"""resources.close ends the background tasks (featurizers loaded ahead, the metrics refresh)
even when one loses a cancellation, as a task inside a redis-py command can on Python 3.11
(``asyncio.wait_for`` drops a cancellation that arrives as the send completes); before, such a
task polled on and its close waited 5 s, or for ever."""

from __future__ import annotations

import asyncio

from service import resources
from tests.conftest import Backend


async def _loses_cancellations(lost: int, ended: list[str]) -> None:
    """Polls until cancelled ``lost`` + 1 times, the first ``lost`` cancellations dropped."""
    try:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if lost == 0:
                    raise
                lost -= 1
    finally:
        ended.append("ended")


async def test_close_ends_a_background_task_that_lost_cancellations(backend: Backend) -> None:
    c = await resources.build(backend.settings, embedded=backend.embedded)
    ended: list[str] = []
    task = asyncio.create_task(_loses_cancellations(2, ended))
    c.caches.background["stubborn"] = task
    await asyncio.sleep(0)
    # a guard against the hang of the code before (a generous bound, not a speed check)
    async with asyncio.timeout(60):
        await resources.close(c)
    assert task.cancelled() and ended == ["ended"]
    assert c.caches.background == {}


async def test_close_retrieves_what_a_background_task_raised(backend: Backend) -> None:
    c = await resources.build(backend.settings, embedded=backend.embedded)

    async def fails() -> None:
        raise RuntimeError("no value here")

    task = asyncio.create_task(fails())
    c.caches.background["fails"] = task
    await asyncio.sleep(0)
    await resources.close(c)
    assert task.done() and isinstance(task.exception(), RuntimeError)
