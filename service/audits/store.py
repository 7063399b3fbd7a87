"""The Redis side of re-identification audits. Every key of audit ``a`` is
``<prefix>:{ra:<a>}:<what>`` and expires at the audit's ``expires_at`` (milliseconds since the
epoch, set at its creation): ``meta`` (a hash: ``spec``, ``status``, ``progress``, ``stage``,
``summary``, ``error``, ``expires_at``) and ``input`` (inline records as float32 bytes and their
labels, deleted when the audit is done or failed). ``<prefix>:{ra-stream:<name>}:latest`` holds
the id of the stream's latest finished audit, with the same expiry as that audit."""

from __future__ import annotations

from typing import Any, cast

import orjson
from redis.asyncio import Redis

from service.keys import Keys


class AuditStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.r = redis
        self.prefix = keys.prefix

    def key(self, a: str, what: str) -> str:
        return f"{self.prefix}:{{ra:{a}}}:{what}"

    def latest_key(self, stream: str) -> str:
        return f"{self.prefix}:{{ra-stream:{stream}}}:latest"

    async def create(
        self, a: str, *, spec: dict[str, Any], data: bytes | None, expires_at_ms: int
    ) -> None:
        meta = self.key(a, "meta")
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
            if data is not None:
                p.set(self.key(a, "input"), data, pxat=expires_at_ms)
            await p.execute()

    async def meta(self, a: str) -> dict[str, bytes] | None:
        data = cast(dict[bytes, bytes], await self.r.hgetall(self.key(a, "meta")))
        return {k.decode(): v for k, v in data.items()} if data else None

    async def input(self, a: str) -> bytes | None:
        v = cast(bytes | None, await self.r.get(self.key(a, "input")))
        return bytes(v) if v is not None else None

    async def set_progress(self, a: str, progress: float, stage: str) -> None:
        meta = self.key(a, "meta")
        if await self.r.exists(meta):  # never re-create an expired audit's hash without a TTL
            await self.r.hset(meta, mapping={"progress": f"{progress:.4f}", "stage": stage})

    async def finish(
        self,
        a: str,
        *,
        expires_at_ms: int,
        summary: dict[str, Any] | None,
        error: str | None,
        stream: str | None,
    ) -> None:
        """Done (``summary``) or failed (``error``), in one transaction that also deletes the
        inline input; then, for a stream source done, the stream's latest."""
        meta = self.key(a, "meta")
        async with self.r.pipeline(transaction=True) as p:
            fields: dict[str, str | bytes] = {
                "status": "done" if error is None else "failed",
                "progress": "1" if error is None else "0",
                "stage": "done" if error is None else "failed",
            }
            if summary is not None:
                fields["summary"] = orjson.dumps(summary)
            if error is not None:
                fields["error"] = error
            p.hset(meta, mapping=fields)  # type: ignore[arg-type]
            p.pexpireat(meta, expires_at_ms)
            p.delete(self.key(a, "input"))
            await p.execute()
        if stream is not None and error is None:  # another hash slot: not in the transaction
            await self.r.set(self.latest_key(stream), a, pxat=expires_at_ms)

    async def latest(self, stream: str) -> str | None:
        v = cast(bytes | None, await self.r.get(self.latest_key(stream)))
        return v.decode() if v is not None else None
