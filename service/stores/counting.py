"""Redis side of counting: a window's counting checkpoint, its tables read after it, new cells
staged under a run's own keys, per-user counters, and the compare-and-set that applies a run's
increments with the move of the checkpoint (count.lua).

Big values never pass through a script: Redis runs one script at a time and serves nobody else
meanwhile, so tables are read and staged by plain GET and SET (which Redis interleaves with
other clients) and only moved into place, by RENAME, inside the compare-and-set."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from redis.asyncio import Redis

from service.lua import source, status_of
from service.stores.keys import Keys
from service.stores.windows import mget_stepwise

# A staging key a crashed counter left behind goes after this, or with the window's raw rows
# (the run is recorded in the part's meta: WindowStore.delete_hot), whichever is first. A run
# stages its tables and calls count.lua right after (well under a second; one whose key expired
# counts the run again); a part p >= 1's staged tables are exact counts (docs/PRIVACY.md).
STAGE_TTL_SECONDS = 60


class CountingStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.r = redis
        self.k = keys
        self._count = redis.register_script(source("count"))

    async def counted(self, s: str, w: int, p: int = 0) -> bytes:
        """Part ``p`` of the window's counting checkpoint: the id of the last hot entry counted
        (b'' when none is)."""
        v = await self.r.hget(self.k.meta(s, w, p), "counted")
        return cast(bytes, v) if v is not None else b""

    async def read_tables(
        self, *, stream: str, window: int, table_ids: Sequence[int], part: int = 0
    ) -> tuple[bytes, list[bytes | None]]:
        """The window's counting checkpoint, then these tables as stored (None: missing), a few
        at a time (``mget_stepwise``: Redis serves others in between). Not atomic, and need
        not be: a count that moves the checkpoint further may land between
        the reads, but then the tables read are newer than the checkpoint, and the
        compare-and-set of a count built on them (expecting that checkpoint) fails as stale.
        What a count that succeeds built on is exactly what counting up to the checkpoint
        left."""
        checkpoint = await self.r.hget(self.k.meta(stream, window, part), "counted")
        tables = await mget_stepwise(
            self.r, [self.k.table(stream, window, t, part) for t in table_ids]
        )
        return (
            bytes(cast(bytes, checkpoint)) if checkpoint is not None else b"",
            [bytes(t) if t is not None else None for t in tables],
        )

    async def stage(
        self, *, stream: str, window: int, token: str, tables: dict[int, bytes], part: int = 0
    ) -> None:
        """Write tables' new cells to this run's staging keys (``Keys.stage``), for count.lua
        to move into place if its compare-and-set succeeds. The run is recorded first in the
        part's meta (field ``stage:<token>``: its table ids), so that a run a crash left can be
        found and its keys deleted with the window's hot data (``WindowStore.delete_hot``)
        rather than left to their TTL; ``done`` drops the record."""
        pipe = self.r.pipeline(transaction=False)
        ids = " ".join(str(t) for t in tables)
        pipe.hset(self.k.meta(stream, window, part), f"stage:{token}", ids)
        for t, value in tables.items():
            pipe.set(self.k.stage(stream, window, token, t, part), value, ex=STAGE_TTL_SECONDS)
        await pipe.execute()

    async def done(self, *, stream: str, window: int, token: str, part: int = 0) -> None:
        """The run's staging keys are moved into place or deleted: its record goes."""
        await self.r.hdel(self.k.meta(stream, window, part), f"stage:{token}")

    async def unstage(
        self, *, stream: str, window: int, token: str, table_ids: list[int], part: int = 0
    ) -> None:
        """Delete a run's staging keys that a failed compare-and-set left, and its record."""
        if table_ids:
            pipe = self.r.pipeline(transaction=False)
            for t in table_ids:
                pipe.delete(self.k.stage(stream, window, token, t, part))
            pipe.hdel(self.k.meta(stream, window, part), f"stage:{token}")
            await pipe.execute()

    async def batch_ids(self, s: str, w: int, p: int, start: int, stop: int) -> list[bytes]:
        """Elements ``start`` … ``stop`` of the part's list of batches to count, their entry
        ids: ``<first id> <last id> <rows>`` each."""
        return cast(list[bytes], await self.r.lrange(self.k.batch_ids(s, w, p), start, stop))

    async def batches(self, s: str, w: int, p: int, start: int, stop: int) -> list[bytes]:
        """Elements ``start`` … ``stop`` of the part's list of batches to count, each its
        rows: ``<row>,<row>,...``."""
        return cast(list[bytes], await self.r.lrange(self.k.batches(s, w, p), start, stop))

    async def next_ids(self, s: str, w: int, p: int, after: Sequence[bytes]) -> list[bytes | None]:
        """For each id of ``after``, the id of the hot entry right after it in the part (b''
        for the first entry), or None when none is: one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for a in after:
            pipe.xrange(self.k.hot(s, w, p), min=b"(" + a if a else "-", max="+", count=1)
        found = await pipe.execute()
        return [bytes(f[0][0]) if f else None for f in found]

    async def seen(self, s: str, w: int, users: Sequence[str], p: int = 0) -> list[int]:
        """Each user's observations seen so far in the window (0 for a new user); a user's
        observations all go to one part (``StreamRuntime.parts_of``), whose counters these are."""
        if not users:
            return []
        got = await self.r.hmget(self.k.users(s, w, p), list(users))
        return [int(v) if v is not None else 0 for v in cast(list, got)]

    async def count(
        self,
        *,
        stream: str,
        window: int,
        expected: bytes,
        checkpoint: bytes,
        table_ids: list[int],
        staged: list[bool],
        values: list[bytes],
        token: str,
        users: bytes,
        users_ttl: int,
        columns: bytes,
        part: int = 0,
        pops: int = 0,
    ) -> tuple[str, bytes | None]:
        """Apply counted increments and move the checkpoint from ``expected`` to ``checkpoint``,
        atomically, unless another counter moved it first: ``('ok', None)``, ``('stale',
        current checkpoint)`` or ``('missing', key)`` (a table: the window is gone; a staging
        key: it expired). ``staged[i]``: table ``table_ids[i]``'s new cells are in its staging
        key of ``token`` (``stage``), else ``values[i]`` is its increments
        (``service.core.features.counting.pack_ops``); the prior table's last (never staged).
        ``users``: ``b'hash seen ...'``; ``columns``: the run's rows by column, appended to the
        window's ``cols`` list. ``part``: the part of the window counted (every key is that
        part's); ``pops``: the batches at the head of the part's list of batches to count
        (``Keys.batches``) that the run counted, popped with it."""
        p = part
        keys = [self.k.meta(stream, window, p), self.k.users(stream, window, p)]
        keys.append(self.k.cols(stream, window, p))
        keys += [self.k.table(stream, window, t, p) for t in table_ids]
        keys.append(self.k.prior(stream, window, p))
        keys += [
            self.k.stage(stream, window, token, t, p)
            for t, s in zip(table_ids, staged, strict=False)
            if s
        ]
        keys += [self.k.batches(stream, window, p), self.k.batch_ids(stream, window, p)]
        modes = "".join("s" if s else "i" for s in staged)
        args: list[bytes | int | str] = [
            expected,
            checkpoint,
            len(values),
            modes,
            *(b"" if s else v for s, v in zip(staged, values, strict=True)),
            users_ttl,
            users,
            columns,
            pops,
        ]
        res = await self._count(keys=keys, args=args)
        return status_of(res), (bytes(res[1]) if len(res) > 1 else None)
