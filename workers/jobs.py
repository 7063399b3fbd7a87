"""Job bodies: plain async functions ``<domain>_<verb>(ctx, ...)``; thin (DESIGN §8).

``ctx["app"]`` is the process's ``AppContext``. Every job is safe to run twice and to crash at
any line (the services they call are idempotent and checkpointed)."""

from __future__ import annotations

import logging
from typing import Any

from service.streams import repository
from service.windows import service as windows

log = logging.getLogger("selectivity.worker")


async def windows_tick(ctx: dict[str, Any]) -> dict[str, int]:
    """For every stream: roll it if its open window is due (or finish an interrupted roll),
    then make sure the next window's noise-initialised tables are prepared."""
    app = ctx["app"]
    async with app.sessionmaker() as session:
        names = [s.name for s in await repository.list_streams(session)]
    rolled = prepared = 0
    for name in names:
        try:
            before = await windows.store_of(app).epoch(name)
            after = await windows.roll(ctx=app, name=name, only_if_due=True)
            rolled += int(after != before)
            prepared += int(await windows.prepare_next(ctx=app, name=name))
        except Exception as exc:  # one stream's failure must not stop the others
            log.error("tick failed for stream %s: %s", name, type(exc).__name__)
    return {"streams": len(names), "rolled": rolled, "prepared": prepared}


async def ingest_count(ctx: dict[str, Any]) -> dict[str, int]:
    """For every stream: count the hot entries accepted since the last run into their
    window's tables (checkpointed per window; a roll counts what is left before it uses a
    window's tables)."""
    from service.ingest import service as ingest
    from service.streams import service as streams

    app = ctx["app"]
    async with app.sessionmaker() as session:
        names = [s.name for s in await repository.list_streams(session)]
    counted = 0
    for name in names:
        try:
            epoch = await windows.store_of(app).epoch(name)
            if epoch is None:
                continue
            rt = await streams.runtime(ctx=app, name=name)
            counted += await ingest.count_hot(ctx=app, rt=rt, epoch=epoch)
        except Exception as exc:  # one stream's failure must not stop the others
            log.error("counting failed for stream %s: %s", name, type(exc).__name__)
    return {"streams": len(names), "counted": counted}


async def windows_roll(ctx: dict[str, Any], *, stream: str) -> int:
    epoch = await windows.roll(ctx=ctx["app"], name=stream)
    await windows.prepare_next(ctx=ctx["app"], name=stream)
    return epoch


async def windows_prepare_next(ctx: dict[str, Any], *, stream: str) -> bool:
    return await windows.prepare_next(ctx=ctx["app"], name=stream)


async def coldstore_seal(ctx: dict[str, Any]) -> dict[str, int]:
    """Seal hot-stream entries into the cold store; expire what is sealed and left the hot
    period."""
    from service.coldstore import service as coldstore

    return await coldstore.seal_all(ctx=ctx["app"])


async def unlock_expire_grants(ctx: dict[str, Any]) -> int:
    from service.coldstore import unlock

    return await unlock.expire_grants(ctx=ctx["app"])


FUNCTIONS = [
    windows_tick,
    ingest_count,
    windows_roll,
    windows_prepare_next,
    coldstore_seal,
    unlock_expire_grants,
]
