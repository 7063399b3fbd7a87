"""The Redis side of every domain: key layout in ``service.stores.keys``, Lua scripts in
``service.lua``, no rules (those are in the domain services). One ``Stores`` per process,
reached as ``ctx.stores.<domain>``."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from service.stores.counting import CountingStore
from service.stores.ingest import IngestStore
from service.stores.keys import Keys
from service.stores.queues import QueueStore
from service.stores.quotas import QuotaStore
from service.stores.windows import WindowStore


@dataclass(frozen=True)
class Stores:
    windows: WindowStore
    ingest: IngestStore
    counting: CountingStore
    queues: QueueStore
    quotas: QuotaStore

    @classmethod
    def build(cls, redis: Redis, keys: Keys) -> Stores:
        return cls(
            windows=WindowStore(redis, keys),
            ingest=IngestStore(redis, keys),
            counting=CountingStore(redis, keys),
            queues=QueueStore(redis, keys),
            quotas=QuotaStore(redis, keys),
        )
