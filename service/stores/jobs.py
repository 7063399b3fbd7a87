"""The Redis side of a long job whose state lives in Redis until it expires (a
re-identification audit, ``service.audits.store``; a k-anonymised release,
``service.anonymize.store``): every key of job ``a`` is ``key(a, what)`` and expires at the
job's ``expires_at`` (milliseconds since the epoch, set at its creation): ``meta`` (a hash:
``spec``, ``status``, ``progress``, ``summary``, ``error``, ``expires_at``, and what the job
adds) and ``input`` (the inline data, deleted when the job is done or failed)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import orjson
from redis.asyncio import Redis


class JobStore:
    def __init__(self, redis: Redis, key: Callable[[str, str], str]) -> None:
        self.r = redis
        self.key = key

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
        return await self._get(a, "input")

    async def _get(self, a: str, what: str) -> bytes | None:
        v = cast(bytes | None, await self.r.get(self.key(a, what)))
        return bytes(v) if v is not None else None

    async def progress(self, a: str, progress: float, **more: str) -> None:
        meta = self.key(a, "meta")
        if await self.r.exists(meta):  # never re-create an expired job's hash without a TTL
            fields: dict[str, str] = {"progress": f"{progress:.4f}", **more}
            await self.r.hset(meta, mapping=fields)  # type: ignore[arg-type]

    async def end(
        self,
        a: str,
        *,
        expires_at_ms: int,
        summary: dict[str, Any] | None,
        error: str | None,
        more: Mapping[str, str] | None = None,
        outputs: Mapping[str, bytes] | None = None,
    ) -> None:
        """Done (``summary``, and ``outputs``: key suffix -> bytes, with the job's expiry) or
        failed (``error``), in one transaction that also deletes the inline input. ``more``:
        other fields of ``meta``."""
        meta = self.key(a, "meta")
        async with self.r.pipeline(transaction=True) as p:
            for what, blob in (outputs or {}).items():
                p.set(self.key(a, what), blob, pxat=expires_at_ms)
            fields: dict[str, str | bytes] = {
                "status": "done" if error is None else "failed",
                "progress": "1" if error is None else "0",
                **(more or {}),
            }
            if summary is not None:
                fields["summary"] = orjson.dumps(summary)
            if error is not None:
                fields["error"] = error
            p.hset(meta, mapping=fields)  # type: ignore[arg-type]
            p.pexpireat(meta, expires_at_ms)
            p.delete(self.key(a, "input"))
            await p.execute()
