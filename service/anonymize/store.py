"""The Redis side of k-anonymisation runs (``service.stores.jobs``): every key of run ``a`` is
``Keys.anonymization(a, ...)`` and expires at the run's ``expires_at``: ``meta`` (a hash:
``spec``, ``status``, ``progress``, ``summary``, ``error``), ``input`` (the inline rows as JSON,
deleted when the run is done or failed), ``result`` (the released table as Arrow IPC) and
``iml`` (an iML session).

A run or session of a stream source is also listed in the stream's index
``<prefix>:{an-stream:<name>}:index`` (a sorted set: id scored by the oldest window it reads),
so that ``expire`` deletes it at the roll that ends that window's hot period
(``service.anonymize.service.expire``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from service.stores.jobs import JobStore
from service.stores.keys import Keys


class AnonymizationStore(JobStore):
    def __init__(self, redis: Redis, keys: Keys) -> None:
        super().__init__(redis, keys.anonymization)
        self.prefix = keys.prefix

    def index_key(self, stream: str) -> str:
        return f"{self.prefix}:{{an-stream:{stream}}}:index"

    async def index(self, stream: str, a: str, *, oldest: int, longest_ms: int) -> None:
        """List ``a`` (a run or an iML session) under the stream, scored by the oldest window
        it reads; ``longest_ms``: the longest any member may live, so the index outlives each
        (it holds ids and window numbers only)."""
        key = self.index_key(stream)
        async with self.r.pipeline(transaction=True) as p:
            p.zadd(key, {a: oldest})
            p.pexpire(key, longest_ms)
            await p.execute()

    async def indexed(self, stream: str, *, before: int | None = None) -> list[str]:
        """The ids listed under the stream; with ``before``, those whose oldest window is
        earlier than ``before``."""
        hi: str | int = "+inf" if before is None else f"({before}"
        ids = cast(list[bytes], await self.r.zrangebyscore(self.index_key(stream), "-inf", hi))
        return [i.decode() for i in ids]

    async def delete(self, stream: str, ids: list[str]) -> int:
        """Every key of the runs and sessions ``ids``, and their index entries: how many of
        them still had a key."""
        n = 0
        for a in ids:  # each id's keys share one hash slot
            n += int(
                await self.r.delete(*(self.key(a, w) for w in ("meta", "input", "result", "iml")))
                > 0
            )
        if ids:
            await self.r.zrem(self.index_key(stream), *ids)
        return n

    async def set_running(self, a: str) -> bool:
        meta = self.key(a, "meta")
        return await self._if_live(
            meta, lambda p: p.hset(meta, mapping={"status": "running", "progress": "0"})
        )

    async def set_progress(self, a: str, progress: float) -> None:
        meta = self.key(a, "meta")
        await self._if_live(meta, lambda p: p.hset(meta, "progress", f"{progress:.4f}"))

    async def _if_live(self, key: str, commands: Callable[[Pipeline], object]) -> bool:
        """Run ``commands`` in one transaction unless ``key`` is gone (expired, or deleted by
        ``delete`` meanwhile), so a deleted run or session is never re-created: whether they
        ran."""
        async with self.r.pipeline(transaction=True) as p:
            try:
                await p.watch(key)
                if not await p.exists(key):
                    await p.unwatch()
                    return False
                p.multi()
                commands(p)
                await p.execute()
            except WatchError:  # deleted (or changed) since the check: leave it
                return False
        return True

    async def finish(
        self,
        a: str,
        *,
        expires_at_ms: int,
        summary: dict[str, Any] | None,
        result: bytes | None,
        error: str | None,
    ) -> bool:
        """Done (``result`` and ``summary``) or failed (``error``), in one transaction that
        also deletes the inline input (as ``JobStore.end``); nothing when the run is gone
        (``_if_live``). Whether it was written."""
        meta = self.key(a, "meta")
        fields: dict[str, str | bytes] = {
            "status": "done" if error is None else "failed",
            "progress": "1" if error is None else "0",
        }
        if summary is not None:
            fields["summary"] = orjson.dumps(summary)
        if error is not None:
            fields["error"] = error

        def commands(p: Pipeline) -> None:
            if result is not None:
                p.set(self.key(a, "result"), result, pxat=expires_at_ms)
            p.hset(meta, mapping=fields)  # type: ignore[arg-type]
            p.pexpireat(meta, expires_at_ms)
            p.delete(self.key(a, "input"))

        return await self._if_live(meta, commands)

    async def result(self, a: str) -> bytes | None:
        return await self._get(a, "result")

    async def save_session(self, s: str, blob: bytes, *, expires_at_ms: int, new: bool) -> bool:
        """An iML session (``service.anonymize.iml``): its spec, sample and state; unless
        ``new``, only while it lives (``_if_live``). Whether it was written."""
        key = self.key(s, "iml")
        if new:
            await self.r.set(key, blob, pxat=expires_at_ms)
            return True
        return await self._if_live(key, lambda p: p.set(key, blob, pxat=expires_at_ms))

    async def session(self, s: str) -> bytes | None:
        return await self._get(s, "iml")
