"""Job bodies: plain async functions, thin, each calling one service (docs/ARCHITECTURE.md,
"Jobs"). ``ctx["app"]`` is the process's ``AppContext``. Every job is safe to run twice and
to crash at any line: the services they call are idempotent and checkpointed, and a roll's
follow-ups are keyed per (stream, epoch) and recorded in SQL (``service.lifecycle.followups``).
"""

from __future__ import annotations

from typing import Any

from service.coldstore import service as coldstore
from service.coldstore import unlock
from service.counting import service as counting
from service.lifecycle import followups, scheduler
from service.queues import service as queues


async def windows_tick(ctx: dict[str, Any]) -> dict[str, int]:
    """Roll every stream that is due, prepare next windows, re-enqueue unfinished follow-ups."""
    return await scheduler.tick(ctx["app"])


async def ingest_count(ctx: dict[str, Any]) -> dict[str, int]:
    """Count hot entries accepted since the last run into their window's tables."""
    return await counting.count_all(ctx["app"])


async def coldstore_seal(ctx: dict[str, Any]) -> dict[str, int]:
    """Seal hot-stream entries into the cold store; expire what is sealed and left the hot
    period."""
    return await coldstore.seal_all(ctx=ctx["app"])


async def unlock_expire_grants(ctx: dict[str, Any]) -> int:
    return await unlock.expire_grants(ctx=ctx["app"])


async def queues_release(ctx: dict[str, Any]) -> dict[str, int]:
    """Release the annotation queues' release periods that have ended."""
    return await queues.release_due(ctx["app"])


# The follow-ups of a roll, one job each, keyed <kind>:<stream>:<epoch>.
async def windows_prepare_next(ctx: dict[str, Any], *, stream: str, epoch: int) -> dict:
    return await followups.run(ctx["app"], kind="windows_prepare_next", name=stream, epoch=epoch)


async def selection_round(ctx: dict[str, Any], *, stream: str, epoch: int) -> dict:
    return await followups.run(ctx["app"], kind="selection_round", name=stream, epoch=epoch)


async def reference_refresh(ctx: dict[str, Any], *, stream: str, epoch: int) -> dict:
    return await followups.run(ctx["app"], kind="reference_refresh", name=stream, epoch=epoch)


async def models_notify(ctx: dict[str, Any], *, stream: str, epoch: int) -> dict:
    return await followups.run(ctx["app"], kind="models_notify", name=stream, epoch=epoch)


FUNCTIONS = [
    windows_tick,
    ingest_count,
    coldstore_seal,
    unlock_expire_grants,
    queues_release,
    windows_prepare_next,
    selection_round,
    reference_refresh,
    models_notify,
]
assert {f.__name__ for f in FUNCTIONS} >= set(followups.KINDS)
