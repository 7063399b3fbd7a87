"""The Redis side of k-anonymisation runs: every key of run ``a`` is ``Keys.anonymization(a,
...)`` and expires at the run's ``expires_at`` (milliseconds since the epoch, set at its
creation): ``meta`` (a hash: ``spec``, ``status``, ``progress``, ``summary``, ``error``),
``input`` (the inline rows as JSON, deleted when the run is done or failed) and ``result``
(the released table as Arrow IPC)."""

from __future__ import annotations

from typing import Any, cast

import orjson
from redis.asyncio import Redis

from service.keys import Keys


class AnonymizationStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.r = redis
        self.k = keys

    async def create(
        self, a: str, *, spec: dict[str, Any], rows: bytes | None, expires_at_ms: int
    ) -> None:
        meta = self.k.anonymization(a, "meta")
        async with self.r.pipeline(transaction=True) as p:
            p.hset(
                meta,
                mapping={
                    "spec": orjson.dumps(spec),
                    "status": "running",
                    "progress": "0",
                    "expires_at": str(expires_at_ms),
                },
            )
            p.pexpireat(meta, expires_at_ms)
            if rows is not None:
                p.set(self.k.anonymization(a, "input"), rows, pxat=expires_at_ms)
            await p.execute()

    async def meta(self, a: str) -> dict[str, bytes] | None:
        data = cast(dict[bytes, bytes], await self.r.hgetall(self.k.anonymization(a, "meta")))
        return {k.decode(): v for k, v in data.items()} if data else None

    async def input(self, a: str) -> bytes | None:
        v = cast(bytes | None, await self.r.get(self.k.anonymization(a, "input")))
        return bytes(v) if v is not None else None

    async def set_running(self, a: str) -> None:
        await self.r.hset(
            self.k.anonymization(a, "meta"), mapping={"status": "running", "progress": "0"}
        )

    async def set_progress(self, a: str, progress: float) -> None:
        meta = self.k.anonymization(a, "meta")
        if await self.r.exists(meta):  # never re-create an expired run's hash without a TTL
            await self.r.hset(meta, "progress", f"{progress:.4f}")

    async def finish(
        self,
        a: str,
        *,
        expires_at_ms: int,
        summary: dict[str, Any] | None,
        result: bytes | None,
        error: str | None,
    ) -> None:
        """Done (``result`` and ``summary``) or failed (``error``), in one transaction that
        also deletes the inline input."""
        meta = self.k.anonymization(a, "meta")
        async with self.r.pipeline(transaction=True) as p:
            if result is not None:
                p.set(self.k.anonymization(a, "result"), result, pxat=expires_at_ms)
            fields: dict[str, str | bytes] = {
                "status": "done" if error is None else "failed",
                "progress": "1" if error is None else "0",
            }
            if summary is not None:
                fields["summary"] = orjson.dumps(summary)
            if error is not None:
                fields["error"] = error
            p.hset(meta, mapping=fields)  # type: ignore[arg-type]
            p.pexpireat(meta, expires_at_ms)
            p.delete(self.k.anonymization(a, "input"))
            await p.execute()

    async def result(self, a: str) -> bytes | None:
        v = cast(bytes | None, await self.r.get(self.k.anonymization(a, "result")))
        return bytes(v) if v is not None else None

    async def save_session(self, s: str, blob: bytes, *, expires_at_ms: int) -> None:
        """An iML session (``service.anonymize.iml``): its spec, sample and state."""
        await self.r.set(self.k.anonymization(s, "iml"), blob, pxat=expires_at_ms)

    async def session(self, s: str) -> bytes | None:
        v = cast(bytes | None, await self.r.get(self.k.anonymization(s, "iml")))
        return bytes(v) if v is not None else None
