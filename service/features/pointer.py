"""The ``served`` pointer of each stream, cached in the API process for ``FRESH_SECONDS`` so
that featurize rarely costs a Redis round trip (the pointer's GET was half of a one-row
featurize's time in process, issue 17).

Freshness: after a roll in another process, featurize here may answer from the previous epoch
for at most ``FRESH_SECONDS`` if it holds that epoch's featurizer in memory; the roll deletes
the previous aggregate from Redis, so a process that has to read it finds it gone and reads the
pointer again (``service.features.service.featurizer``). A roll in this process (``moved``) is
seen at once. A read that a move overtook is not cached."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from service.context import AppContext

FRESH_SECONDS = 0.02


@dataclass
class ServedCache:
    generation: int = 0  # moves made here: a read from Redis older than a move is not cached
    epochs: dict[str, tuple[float, int | None]] = field(default_factory=dict)


def _cache(ctx: AppContext) -> ServedCache:
    if ctx.caches.served is None:
        ctx.caches.served = ServedCache()
    return ctx.caches.served  # type: ignore[no-any-return]


async def served(ctx: AppContext, name: str) -> int | None:
    """The stream's served epoch (None: no count period yet, or no such stream)."""
    cache = _cache(ctx)
    hit = cache.epochs.get(name)
    if hit is not None and time.monotonic() - hit[0] < FRESH_SECONDS:
        return hit[1]
    generation = cache.generation
    value = await ctx.stores.windows.served(name)
    if cache.generation == generation:
        cache.epochs[name] = (time.monotonic(), value)
    return value


def cached(ctx: AppContext, name: str) -> int | None:
    """The epoch this process holds for the stream (fresh or not), None if none."""
    hit = _cache(ctx).epochs.get(name)
    return hit[1] if hit is not None else None


def moved(ctx: AppContext, name: str, epoch: int | None) -> None:
    """This process moved the pointer (a roll, a new stream): its requests see it at once."""
    cache = _cache(ctx)
    cache.generation += 1
    cache.epochs[name] = (time.monotonic(), epoch)
