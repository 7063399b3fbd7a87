"""Process-wide resources, built once (in the API's lifespan or the worker's startup)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.process
import functools
import multiprocessing
import multiprocessing.forkserver
import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from service.config import Settings
from service.jobs import Jobs
from service.stores import Stores
from service.stores.keys import Keys
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


POOL_PRELOAD = ("service.windows.service",)
"""What the pool's forkserver imports once, at its start, for every worker it forks: the module
of the noise draws (a stream's creation and every roll) with numpy. A worker then starts
without importing anything, and the first stream creation of a fresh server does not pay for
the imports (``start_forkserver``, ``start_process_pool``)."""


def _preload() -> None:
    """The forkserver's imports: ``__main__`` (multiprocessing's default: a script's functions)
    or, for ``python -m <name>``, that module (which each worker runs again as its
    ``__mp_main__``, its imports then cached; not a package's ``__main__``, whose body would run,
    and which multiprocessing does not run again), and ``POOL_PRELOAD``. No effect once the
    forkserver runs."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None) or "__main__"
    main = [] if name.rpartition(".")[2] == "__main__" else [name]
    mp = multiprocessing.get_context("forkserver")
    mp.set_forkserver_preload(["__main__", *main, *POOL_PRELOAD])


def start_forkserver() -> None:
    """Start the pool's forkserver now: its imports (``_preload``) then run in parallel with
    what the caller does next (``selectivity serve``: the migrations and the app's imports)."""
    _preload()
    multiprocessing.forkserver.ensure_running()


def _pool_worker_init(service_pid: int) -> None:
    """A pool worker ignores SIGINT. Ctrl-C sends it to the terminal's whole process group: the
    service stops its pool itself (``stop_process_pool``), and a worker interrupted in its wait
    for work would print a ``KeyboardInterrupt`` traceback as it dies.

    It also ends when the service that started it ends, ``kill -9`` included: it holds both ends
    of its own call queue, so it would never see the service go, and it holds the forkserver's
    "alive" pipe, so that would stay too. A thread waits on a pidfd of the service (readable
    once the service has exited, reaped or not) and exits the process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        fd = os.pidfd_open(service_pid)
    except ProcessLookupError:
        os._exit(0)

    def exit_with_the_service() -> None:
        select.select([fd], [], [])
        os._exit(0)

    threading.Thread(target=exit_with_the_service, name="exit-with-service", daemon=True).start()


def _ready() -> None:
    """A no-op run in a new pool, so that its forkserver and worker are started."""


def make_process_pool(workers: int = 1) -> concurrent.futures.ProcessPoolExecutor:
    """A pool of ``workers`` processes forked from a forkserver that has imported
    ``POOL_PRELOAD``; processes start on first use (``start_process_pool``: at once)."""
    _preload()
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("forkserver"),
        initializer=_pool_worker_init,
        initargs=(os.getpid(),),
    )


async def start_process_pool(workers: int = 1) -> concurrent.futures.ProcessPoolExecutor:
    """``make_process_pool`` with its forkserver and worker started and ready. Starting them
    costs a second or two of CPU on a loaded machine (the forkserver's imports), and blocks the
    thread that first submits work until the forkserver has forked: here a thread of its own,
    while the caller goes on, so that the API's start-up pays for it before it listens, rather
    than its first stream creation."""
    pool = make_process_pool(workers)
    try:
        await asyncio.to_thread(lambda: pool.submit(_ready).result())
    except BaseException:
        stop_process_pool(pool)
        raise
    return pool


def stop_process_pool(executor: concurrent.futures.Executor, *, timeout: float = 5.0) -> None:
    """Shut ``executor`` down without waiting for the work it runs: queued work is cancelled
    and a process pool's workers are terminated (the job that gave it that work has been
    cancelled already, and is retried by the next start); other executors are waited for."""
    if not isinstance(executor, concurrent.futures.ProcessPoolExecutor):
        executor.shutdown(wait=True, cancel_futures=True)
        return
    # the workers, read before the shutdown forgets them (CPython keeps them by pid; 3.14 adds
    # ``terminate_workers``)
    processes = list((getattr(executor, "_processes", None) or {}).values())
    executor.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(timeout)
