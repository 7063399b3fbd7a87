"""The Redis side of re-identification audits (``service.stores.jobs``). Every key of audit
``a`` is ``<prefix>:{ra:<a>}:<what>`` and expires at the audit's ``expires_at``: ``meta`` (a
hash: ``spec``, ``status``, ``progress``, ``stage``, ``summary``, ``error``, ``expires_at``,
and the job's checkpoints: ``inputs``, ``release:<i>``, ``draw:<i>``, ``final``) and ``input``
(inline records as float32 bytes and their labels, or a stream source's records as read, one
bit a value; deleted when the audit is done or failed). ``<prefix>:{ra-stream:<name>}:latest``
holds the id of the stream's latest finished audit, with the same expiry as that audit.

An audit of a stream source is also listed in the stream's index
``<prefix>:{ra-stream:<name>}:index`` (a sorted set: id scored by the oldest window whose hot
records it reads, listed before it reads them), so that ``expire`` deletes it at the roll that
ends that window's hot period (``service.audits.service.expire_for_stream``). Writes to an
audit's ``meta`` after its creation happen only while it exists (``_if_live``): a deleted audit
is never re-created by a job still running."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from service.stores.jobs import JobStore
from service.stores.keys import Keys


class AuditStore(JobStore):
    def __init__(self, redis: Redis, keys: Keys) -> None:
        prefix = self.prefix = keys.prefix
        super().__init__(redis, lambda a, what: f"{prefix}:{{ra:{a}}}:{what}")

    def latest_key(self, stream: str) -> str:
        return f"{self.prefix}:{{ra-stream:{stream}}}:latest"

    def index_key(self, stream: str) -> str:
        return f"{self.prefix}:{{ra-stream:{stream}}}:index"

    async def index(self, stream: str, a: str, *, oldest: int, longest_ms: int) -> None:
        """List ``a`` under the stream, scored by the oldest window it reads; ``longest_ms``:
        the longest any audit may live, so the index outlives each (ids and window numbers)."""
        key = self.index_key(stream)
        async with self.r.pipeline(transaction=True) as p:
            p.zadd(key, {a: oldest})
            p.pexpire(key, longest_ms)
            await p.execute()

    async def indexed(self, stream: str, *, before: int | None = None) -> list[str]:
        """The audits listed under the stream; with ``before``, those whose oldest window is
        earlier than ``before``."""
        hi: str | int = "+inf" if before is None else f"({before}"
        ids = cast(list[bytes], await self.r.zrangebyscore(self.index_key(stream), "-inf", hi))
        return [i.decode() for i in ids]

    async def delete(self, stream: str, ids: list[str]) -> int:
        """Every key of the audits ``ids``, their index entries, and the stream's latest when
        it is one of them: how many of them still had a key."""
        n = 0
        for a in ids:  # each audit's keys share one hash slot
            n += int(await self.r.delete(self.key(a, "meta"), self.key(a, "input")) > 0)
        if ids:
            await self.r.zrem(self.index_key(stream), *ids)
            if await self.latest(stream) in ids:
                await self.r.delete(self.latest_key(stream))
        return n

    async def _if_live(self, key: str, commands: Callable[[Pipeline], object]) -> bool:
        """Run ``commands`` in one transaction unless ``key`` is gone (expired, or deleted by
        ``delete`` meanwhile), so a deleted audit is never re-created: whether they ran."""
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

    async def set_progress(self, a: str, progress: float, stage: str) -> None:
        meta = self.key(a, "meta")
        fields = {"progress": f"{progress:.4f}", "stage": stage}
        await self._if_live(meta, lambda p: p.hset(meta, mapping=fields))  # type: ignore[arg-type]

    async def checkpoint(self, a: str, fields: dict[str, bytes]) -> bool:
        """Add checkpoint fields to the audit's ``meta`` (``service.audits.service._attacks``)
        while it exists: whether they were written."""
        meta = self.key(a, "meta")
        return await self._if_live(meta, lambda p: p.hset(meta, mapping=fields))  # type: ignore[arg-type]

    async def keep_input(self, a: str, blob: bytes, *, expires_at_ms: int, inputs: bytes) -> bool:
        """Keep a stream source's encoded records as the audit's ``input`` (deleted when it
        ends, expiring with it) and what was read with them as ``meta``'s ``inputs``, in one
        transaction while the audit exists: whether they were written."""
        meta = self.key(a, "meta")

        def write(p: Pipeline) -> None:
            p.set(self.key(a, "input"), blob, pxat=expires_at_ms)
            p.hset(meta, "inputs", inputs)

        return await self._if_live(meta, write)

    async def finish(
        self,
        a: str,
        *,
        expires_at_ms: int,
        summary: dict[str, Any] | None,
        error: str | None,
        stream: str | None,
    ) -> bool:
        """Done (``summary``) or failed (``error``), in one transaction that also deletes the
        inline input; nothing when the audit is gone (``_if_live``); then, for a stream source
        done, the stream's latest. Whether it was written."""
        meta = self.key(a, "meta")
        fields: dict[str, str | bytes] = {
            "status": "done" if error is None else "failed",
            "stage": "done" if error is None else "failed",
        }
        if error is None:  # a failed audit keeps the progress it had reached
            fields["progress"] = "1"
        if summary is not None:
            fields["summary"] = orjson.dumps(summary)
        if error is not None:
            fields["error"] = error

        def write(p: Pipeline) -> None:
            p.hset(meta, mapping=fields)  # type: ignore[arg-type]
            p.pexpireat(meta, expires_at_ms)
            p.delete(self.key(a, "input"))

        written = await self._if_live(meta, write)
        if not written:
            await self.r.delete(self.key(a, "input"))
        elif stream is not None and error is None:  # another hash slot: not in the transaction
            await self.r.set(self.latest_key(stream), a, pxat=expires_at_ms)
        return written

    async def latest(self, stream: str) -> str | None:
        v = cast(bytes | None, await self.r.get(self.latest_key(stream)))
        return v.decode() if v is not None else None
