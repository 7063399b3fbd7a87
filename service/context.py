"""Process-wide resources, built once (in the API's lifespan or the worker's startup)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.process
import functools
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from service.config import Settings
from service.jobs import Jobs
from service.keys import Keys
from service.stores import Stores
from service.vault import Vault

T = TypeVar("T")


@dataclass
class Caches:
    """Per-process caches, each owned by the one domain service named beside it (values are
    that domain's types; this module sits below the domains and does not import them)."""

    keys: dict[bytes, tuple[float, Any]] = field(default_factory=dict)  # admin: principals
    runtimes: dict[str, tuple[float, Any]] = field(default_factory=dict)  # streams
    featurizers: dict[str, Any] = field(default_factory=dict)  # features, by stream
    # features: the next epoch's featurizer, loaded before the roll serves it, and the tasks
    # that wait for it (cancelled by ``resources.close``)
    featurizers_ahead: dict[str, Any] = field(default_factory=dict)
    served: Any = None  # features: the served pointers (``features.pointer.ServedCache``)
    background: dict[str, Any] = field(default_factory=dict)  # asyncio tasks, by name
    model_status: dict[str, tuple[float, str, str, int]] = field(default_factory=dict)  # models
    open_epochs: dict[str, int] = field(default_factory=dict)  # ingest
    boosters: dict[tuple[int, int], tuple[int, Any]] = field(default_factory=dict)  # reference
    queue_runtimes: dict[str, tuple[float, Any]] = field(default_factory=dict)  # queues
    # api.ratelimit: the in-process buckets of LOCAL_CLASSES, (key id, class) → theoretical
    # arrival time (monotonic seconds)
    rate_buckets: dict[tuple[str, str], float] = field(default_factory=dict)
    # ingest: (a cold-store key exists, monotonic time of the look-up)
    coldstore_key: tuple[bool, float] = (False, float("-inf"))


@dataclass
class AppContext:
    settings: Settings
    redis: Redis
    engine: AsyncEngine
    sessionmaker: async_sessionmaker
    keys: Keys
    stores: Stores
    jobs: Jobs
    executor: concurrent.futures.Executor | None = None
    caches: Caches = field(default_factory=Caches)
    vault: Vault = field(default_factory=Vault)  # break-glass secrets: memory only

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
