"""Redis side of features: reading the hot stream for the train set (DESIGN §7 key layout)."""

from __future__ import annotations

from typing import cast

from redis.asyncio import Redis

from service.keys import Keys
from service.lua import source


class FeatureStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.k = keys
        self._chunk = redis.register_script(source("hot_chunk"))

    async def hot_chunk(
        self, s: str, w: int, start: bytes | str, end: bytes | str, count: int
    ) -> tuple[bytes, int, bytes] | None:
        """Up to ``count`` entries of window ``w``'s hot stream in ``[start, end]``:
        ``(last entry id, number of entries, b'row,row,...')`` with each entry's raw JSON row
        (parse with ``orjson.loads(b"[" + rows + b"]")``), or None when there are none. One
        bulk string instead of a reply object per entry: an XRANGE parsed entry by entry was
        most of a train-set chunk's reading time."""
        res = await self._chunk(keys=[self.k.hot(s, w)], args=[start, end, count])
        if not res:
            return None
        last, n, rows = cast(list, res)
        return bytes(last), int(n), bytes(rows)
