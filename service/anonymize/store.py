"""The Redis side of k-anonymisation runs (``service.stores.jobs``): every key of run ``a`` is
``Keys.anonymization(a, ...)`` and expires at the run's ``expires_at``: ``meta`` (a hash:
``spec``, ``status``, ``progress``, ``summary``, ``error``), ``input`` (the inline rows as JSON,
deleted when the run is done or failed), ``result`` (the released table as Arrow IPC) and
``iml`` (an iML session)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from service.keys import Keys
from service.stores.jobs import JobStore


class AnonymizationStore(JobStore):
    def __init__(self, redis: Redis, keys: Keys) -> None:
        super().__init__(redis, keys.anonymization)

    async def set_running(self, a: str) -> None:
        await self.r.hset(self.key(a, "meta"), mapping={"status": "running", "progress": "0"})

    async def set_progress(self, a: str, progress: float) -> None:
        await self.progress(a, progress)

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
        await self.end(
            a,
            expires_at_ms=expires_at_ms,
            summary=summary,
            error=error,
            outputs=None if result is None else {"result": result},
        )

    async def result(self, a: str) -> bytes | None:
        return await self._get(a, "result")

    async def save_session(self, s: str, blob: bytes, *, expires_at_ms: int) -> None:
        """An iML session (``service.anonymize.iml``): its spec, sample and state."""
        await self.r.set(self.key(s, "iml"), blob, pxat=expires_at_ms)

    async def session(self, s: str) -> bytes | None:
        return await self._get(s, "iml")
