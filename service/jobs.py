"""Durable work for the worker: jobs enqueued by name on the SAQ queue in Redis
(``workers.jobs`` holds their bodies). A job is keyed: enqueuing a key that is queued or
running already is a no-op, so callers may enqueue freely (the scheduler tick re-enqueues
every unfinished follow-up)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from saq.queue.redis import RedisQueue

from service.keys import Keys


def queue_name(keys: Keys) -> str:
    """The SAQ queue's name: a hash tag, so that every key SAQ derives from it (its lists,
    sets and job records) lands in one slot of a Redis Cluster and its scripts run there."""
    return f"{{{keys.prefix}:jobs}}"


class Jobs:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.queue = RedisQueue(redis, name=queue_name(keys))
        self._tag = queue_name(keys)  # job keys carry it too (SAQ's abort key is per job key)

    async def enqueue(
        self, function: str, *, key: str, timeout: int = 600, retries: int = 3, **kwargs: Any
    ) -> bool:
        """Enqueue ``function(**kwargs)`` under ``key``; False when that key is already
        queued or running. ``retries``: runs after a failure or a lost worker (a worker that
        died mid-job: ``workers.runner`` requeues its jobs within seconds)."""
        job = await self.queue.enqueue(
            function, key=f"{self._tag}:{key}", timeout=timeout, retries=retries, **kwargs
        )
        return job is not None
