"""The Redis side of re-identification audits (``service.stores.jobs``). Every key of audit
``a`` is ``<prefix>:{ra:<a>}:<what>`` and expires at the audit's ``expires_at``: ``meta`` (a
hash: ``spec``, ``status``, ``progress``, ``stage``, ``summary``, ``error``, ``expires_at``)
and ``input`` (inline records as float32 bytes and their labels, deleted when the audit is done
or failed). ``<prefix>:{ra-stream:<name>}:latest`` holds the id of the stream's latest finished
audit, with the same expiry as that audit."""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio import Redis

from service.keys import Keys
from service.stores.jobs import JobStore


class AuditStore(JobStore):
    def __init__(self, redis: Redis, keys: Keys) -> None:
        prefix = self.prefix = keys.prefix
        super().__init__(redis, lambda a, what: f"{prefix}:{{ra:{a}}}:{what}")

    def latest_key(self, stream: str) -> str:
        return f"{self.prefix}:{{ra-stream:{stream}}}:latest"

    async def set_progress(self, a: str, progress: float, stage: str) -> None:
        await self.progress(a, progress, stage=stage)

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
        await self.end(
            a,
            expires_at_ms=expires_at_ms,
            summary=summary,
            error=error,
            more={"stage": "done" if error is None else "failed"},
        )
        if stream is not None and error is None:  # another hash slot: not in the transaction
            await self.r.set(self.latest_key(stream), a, pxat=expires_at_ms)

    async def latest(self, stream: str) -> str | None:
        v = cast(bytes | None, await self.r.get(self.latest_key(stream)))
        return v.decode() if v is not None else None
