"""Redis side of ingest: accepting a batch into the open window's hot stream (ingest.lua),
and finding a retried batch's stored response."""

from __future__ import annotations

from redis.asyncio import Redis

from service.keys import Keys
from service.lua import source, status_of


class IngestStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.r = redis
        self.k = keys
        self._ingest = redis.register_script(source("ingest"))

    async def accept(
        self,
        *,
        stream: str,
        window: int,
        token: str,
        rows: list[bytes],
        response: bytes,
        ttl: int,
    ) -> tuple[str, bytes | None]:
        """Append a batch's raw rows to the window's hot stream if the window is open and the
        idempotency token new: ``('ok', None)``, ``('closed', None)`` or ``('dup', stored
        response)``."""
        keys = [
            self.k.meta(stream, window),
            self.k.idem(stream, window, token),
            self.k.hot(stream, window),
        ]
        res = await self._ingest(keys=keys, args=[ttl, response, *rows])
        return status_of(res), (res[1] if len(res) > 1 else None)

    async def find_replay(self, *, stream: str, windows: list[int], token: str) -> bytes | None:
        """The stored response of a batch with this idempotency token in earlier windows."""
        if not windows:
            return None
        pipe = self.r.pipeline(transaction=False)
        for w in windows:
            pipe.get(self.k.idem(stream, w, token))
        for found in await pipe.execute():
            if found is not None:
                return found
        return None
