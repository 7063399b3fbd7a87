"""Redis side of counting: a window's counting checkpoint, its tables read with it
(count_read.lua), per-user counters, and the compare-and-set that applies a run's increments
with the move of the checkpoint (count.lua)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from redis.asyncio import Redis

from service.keys import Keys
from service.lua import source, status_of


class CountingStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.r = redis
        self.k = keys
        self._count = redis.register_script(source("count"))
        self._read = redis.register_script(source("count_read"))

    async def counted(self, s: str, w: int) -> bytes:
        """The window's counting checkpoint: the id of the last hot entry counted (b'' when
        none is)."""
        v = await self.r.hget(self.k.meta(s, w), "counted")
        return cast(bytes, v) if v is not None else b""

    async def read_tables(
        self, *, stream: str, window: int, table_ids: Sequence[int]
    ) -> tuple[bytes, list[bytes | None]]:
        """The window's counting checkpoint and these tables as stored (None: missing), read
        together by one script: the tables are what counting up to that checkpoint left."""
        keys = [self.k.meta(stream, window)]
        keys += [self.k.table(stream, window, t) for t in table_ids]
        checkpoint, *tables = await self._read(keys=keys)
        return bytes(checkpoint), [bytes(t) if t is not None else None for t in tables]

    async def seen(self, s: str, w: int, users: Sequence[str]) -> list[int]:
        """Each user's observations seen so far in the window (0 for a new user)."""
        if not users:
            return []
        got = await self.r.hmget(self.k.users(s, w), list(users))
        return [int(v) if v is not None else 0 for v in cast(list, got)]

    async def count(
        self,
        *,
        stream: str,
        window: int,
        expected: bytes,
        checkpoint: bytes,
        table_ids: list[int],
        whole: list[bool],
        values: list[bytes],
        users: bytes,
        users_ttl: int,
        columns: bytes,
    ) -> tuple[str, bytes | None]:
        """Apply counted increments and move the checkpoint from ``expected`` to ``checkpoint``,
        atomically, unless another counter moved it first: ``('ok', None)``, ``('stale',
        current checkpoint)`` or ``('missing', table key)``. ``values[i]``: table
        ``table_ids[i]``'s new cells when ``whole[i]``, else its increments
        (``service.core.counting.pack_ops``); the prior table's last. ``users``:
        ``b'hash seen ...'``; ``columns``: the run's rows by column, appended to the
        window's ``cols`` list."""
        keys = [self.k.meta(stream, window), self.k.users(stream, window)]
        keys.append(self.k.cols(stream, window))
        keys += [self.k.table(stream, window, t) for t in table_ids]
        keys.append(self.k.prior(stream, window))
        modes = "".join("s" if w else "i" for w in whole)
        args: list[bytes | int | str] = [
            expected,
            checkpoint,
            len(values),
            modes,
            *values,
            users_ttl,
            users,
            columns,
        ]
        res = await self._count(keys=keys, args=args)
        return status_of(res), (bytes(res[1]) if len(res) > 1 else None)
