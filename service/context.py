"""Process-wide resources, built once (in the API's lifespan or the worker's startup)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.process
import functools
import multiprocessing
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from service.config import Settings
from service.keys import Keys

T = TypeVar("T")


@dataclass
class AppContext:
    settings: Settings
    redis: Redis
    engine: AsyncEngine
    sessionmaker: async_sessionmaker
    keys: Keys
    executor: concurrent.futures.Executor | None = None
    caches: dict[str, Any] = field(default_factory=dict)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in the background, tracked so that ``resources.close`` waits for it."""
        task = asyncio.create_task(coro)
        tasks: set[asyncio.Task[Any]] = self.caches.setdefault("background", set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    async def run_cpu(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """CPU-heavy work (noise generation, model training) off the event loop: in the
        process pool when there is one, else in a thread. A pool whose worker died (a native
        crash in a library kills the process and breaks the whole pool) is replaced by a
        fresh one, so that one crashed job never stops the next window's noise or model; the
        job that was running when it broke fails."""
        call = functools.partial(fn, *args, **kwargs)
        executor = self.executor
        if executor is None:
            return await asyncio.to_thread(call)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(executor, call)
        except concurrent.futures.process.BrokenProcessPool:
            if self.executor is executor and isinstance(
                executor, concurrent.futures.ProcessPoolExecutor
            ):
                executor.shutdown(wait=False, cancel_futures=True)
                self.executor = make_process_pool()  # (the API and worker run one)
            raise


def make_process_pool(workers: int = 1) -> concurrent.futures.ProcessPoolExecutor:
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=multiprocessing.get_context("forkserver")
    )
