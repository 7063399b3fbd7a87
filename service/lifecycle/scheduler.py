"""The scheduler tick (the worker's ``windows_tick`` cron job): for every stream, roll it when
its open window is due (or finish an interrupted roll), make sure the next window is
prepared, re-enqueue every unfinished follow-up of earlier rolls, and remove streams whose
creation died with its process."""

from __future__ import annotations

import logging

from service.context import AppContext
from service.lifecycle import followups
from service.lifecycle import streams as lifecycle_streams
from service.lifecycle.roll import roll
from service.streams import repository
from service.windows import service as windows

log = logging.getLogger("selectivity.lifecycle")


async def tick(ctx: AppContext) -> dict[str, int]:
    async with ctx.sessionmaker() as session:
        names = [s.name for s in await repository.list_streams(session)]
    rolled = prepared = 0
    for name in names:
        try:
            before = await ctx.stores.windows.epoch(name)
            after = await roll(ctx=ctx, name=name, only_if_due=True)
            rolled += int(after != before)
            prepared += int(await windows.prepare_next(ctx=ctx, name=name))
        except Exception as exc:  # one stream's failure must not stop the others
            log.error("tick failed for stream %s: %s", name, type(exc).__name__)
    requeued = await followups.enqueue_pending(ctx)
    try:  # streams whose creation died with its process
        abandoned = await lifecycle_streams.clean_abandoned(ctx)
    except Exception as exc:
        log.error("cleaning abandoned stream creations failed: %s", type(exc).__name__)
        abandoned = 0
    return {
        "streams": len(names),
        "rolled": rolled,
        "prepared": prepared,
        "requeued": requeued,
        "abandoned_creations": abandoned,
    }
