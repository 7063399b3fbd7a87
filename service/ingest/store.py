"""Redis side of ingest: the one Lua script that applies a batch to a window."""

from __future__ import annotations

from redis.asyncio import Redis

from service.keys import Keys
from service.lua import source


class IngestStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.r = redis
        self.k = keys
        self._ingest = redis.register_script(source("ingest"))

    async def apply(
        self,
        *,
        stream: str,
        window: int,
        token: str,
        table_ids: list[int],
        ops: list[bytes],
        rows: list[bytes],
        response: bytes,
        ttl: int,
    ) -> tuple[str, bytes | None]:
        """ops[i]: table_ids[i]'s increments, ``#<cell> <delta> ...`` (``service.pack_ops``);
        the prior table's come last (ops has one more entry than table_ids)."""
        keys = [
            self.k.meta(stream, window),
            self.k.idem(stream, window, token),
            self.k.hot(stream, window),
        ]
        keys += [self.k.table(stream, window, t) for t in table_ids]
        keys.append(self.k.prior(stream, window))
        args: list[bytes | int | str] = [ttl, response, len(ops), *ops, len(rows)]
        args.extend(rows)
        res = await self._ingest(keys=keys, args=args)
        status = res[0].decode() if isinstance(res[0], bytes) else str(res[0])
        return status, (res[1] if len(res) > 1 else None)

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
