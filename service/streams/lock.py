"""The per-stream lock: rolls, expiry outside a roll, and the commit of a selection round hold
it, so none of them interleave on one stream (docs/ARCHITECTURE.md, "Life cycle")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from redis.exceptions import LockError

from service.context import AppContext
from service.errors import ServiceError, Unavailable

LOCK_WAIT_SECONDS = 600.0  # a caller waits this long for the holder to finish


@contextlib.asynccontextmanager
async def stream_lock(
    ctx: AppContext,
    name: str,
    *,
    wait: float = LOCK_WAIT_SECONDS,
    busy: ServiceError | None = None,
) -> AsyncIterator[None]:
    """Hold stream ``name``'s lock, renewed while held: it expires ``roll_lock_seconds`` after
    its holder dies, so a killed holder blocks the next one for at most that long, however
    long a live one takes. Waits up to ``wait`` seconds, then raises ``busy`` (default: 503).
    A stream's creation holds it too, from before its row exists until it is ready."""
    ttl = ctx.settings.roll_lock_seconds
    lock = ctx.stores.windows.lock(name, "roll", timeout=ttl, blocking_timeout=wait)
    if not await lock.acquire():
        raise busy or Unavailable(
            f"stream {name!r} is being rolled by another process; retry later"
        )

    stop = asyncio.Event()

    async def renew() -> None:
        # stops by the flag as well as by cancellation: on Python 3.11 a cancellation that
        # arrives as a Redis command's send completes can be lost (resources.cancel_all)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ttl / 3)
            if not stop.is_set():
                await lock.reacquire()

    keeper = asyncio.create_task(renew())
    try:
        yield
    finally:
        stop.set()
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await keeper
        with contextlib.suppress(LockError):  # expired while we were stalled: nothing to free
            await lock.release()
