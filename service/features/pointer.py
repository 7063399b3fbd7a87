"""The ``served`` pointer of each stream, cached in the API process so that featurize costs no
Redis round trip (it was half of a one-row featurize's time in process, issue 17).

Freshness: every move of the pointer is published (``WindowStore.set_served``); one
subscription per process updates the cache when the message comes, well under a millisecond
after the move. The cache is used only while that subscription is confirmed; until then, and
from the moment it fails until it is back, every request reads the pointer from Redis. A
cached value is also read again after ``FRESH_SECONDS`` whatever happens, so a message lost
(a roll killed between its ``SET`` and its ``PUBLISH``, completed later) leaves featurize on
the previous epoch for at most that long."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from service.context import AppContext

log = logging.getLogger("selectivity.features")

FRESH_SECONDS = 1.0
RETRY_SECONDS = 1.0


@dataclass
class ServedCache:
    live: bool = False  # the subscription is confirmed: the cache may be used
    generation: int = 0  # moves seen: a read from Redis older than a move is not cached
    epochs: dict[str, tuple[float, int | None]] = field(default_factory=dict)


def _cache(ctx: AppContext) -> ServedCache:
    if ctx.caches.served is None:
        ctx.caches.served = ServedCache()
    return ctx.caches.served  # type: ignore[no-any-return]


async def served(ctx: AppContext, name: str) -> int | None:
    """The stream's served epoch (None: no count period yet, or no such stream)."""
    cache = _cache(ctx)
    _watch(ctx, cache)
    if cache.live:
        hit = cache.epochs.get(name)
        if hit is not None and time.monotonic() - hit[0] < FRESH_SECONDS:
            return hit[1]
    generation = cache.generation
    value = await ctx.stores.windows.served(name)
    if cache.live and cache.generation == generation:
        cache.epochs[name] = (time.monotonic(), value)
    return value


def moved(ctx: AppContext, name: str, epoch: int | None) -> None:
    """This process moved the pointer (a roll, a new stream): its own requests see the move at
    once, not when its own message comes back."""
    cache = _cache(ctx)
    cache.generation += 1
    if cache.live:
        cache.epochs[name] = (time.monotonic(), epoch)
    else:
        cache.epochs.pop(name, None)


def _watch(ctx: AppContext, cache: ServedCache) -> None:
    task = ctx.caches.background.get("served-watch")
    if task is None or task.done():
        ctx.caches.background["served-watch"] = asyncio.create_task(_watch_loop(ctx, cache))


async def _watch_loop(ctx: AppContext, cache: ServedCache) -> None:
    channel = ctx.keys.served_channel()
    while True:
        pubsub: Any = ctx.redis.pubsub()
        try:
            await pubsub.subscribe(channel)
            async for message in pubsub.listen():
                kind = message["type"]
                if kind in ("subscribe", b"subscribe"):
                    cache.generation += 1
                    cache.epochs.clear()
                    cache.live = True
                elif kind in ("message", b"message"):
                    name, epoch = orjson.loads(message["data"])
                    cache.generation += 1
                    cache.epochs[str(name)] = (time.monotonic(), epoch)
        except asyncio.CancelledError:  # the process is closing: its pool closes the connection
            cache.live = False
            cache.epochs.clear()
            raise
        except Exception as exc:  # Redis went away: read the pointer per request till back
            log.warning("the served-pointer subscription failed: %s", type(exc).__name__)
        cache.live = False
        cache.epochs.clear()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(pubsub.aclose(), RETRY_SECONDS)
        await asyncio.sleep(RETRY_SECONDS)
