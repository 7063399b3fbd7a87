"""Redis side of the per-key limits (``service.api.ratelimit`` holds the rules): a token
bucket per (API key, endpoint class) taken by ``rate.lua``, and a counter per (API key,
kind) of what the key created, reserved by ``quota.lua``. One key each, so both work on
Redis Cluster, and one round trip a request."""

from __future__ import annotations

from typing import cast

from redis.asyncio import Redis

from service.lua import source
from service.stores.keys import Keys


class QuotaStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.r = redis
        self.k = keys
        self._rate = redis.register_script(source("rate"))
        self._quota = redis.register_script(source("quota"))

    async def take(self, *, key_id: str, cls: str, interval_us: int, burst: int) -> int:
        """Take a token from the bucket of ``key_id``'s requests of class ``cls`` (refilled
        one every ``interval_us`` microseconds, holding at most ``burst``): 0 when taken,
        else the microseconds until one is there."""
        wait = await self._rate(
            keys=[self.k.rate(key_id, cls)], args=[max(1, interval_us), max(1, burst)]
        )
        return int(cast(int, wait))

    async def reserve(self, *, key_id: str, kind: str, cap: int) -> tuple[bool, int]:
        """One more creation of ``kind`` by ``key_id`` if it has made fewer than ``cap``:
        (reserved, how many it has made counting this one, or the count that refused it)."""
        ok, n = cast(list[int], await self._quota(keys=[self.k.quota(key_id, kind)], args=[cap]))
        return bool(ok), int(n)

    async def release(self, *, key_id: str, kind: str) -> None:
        """Give back a reservation whose creation failed."""
        await self.r.decr(self.k.quota(key_id, kind))

    async def created(self, *, key_id: str, kind: str) -> int:
        v = await self.r.get(self.k.quota(key_id, kind))
        return int(cast(bytes, v)) if v is not None else 0
