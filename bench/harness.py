"""The service in the benchmark's own process, as the tests build it: an embedded Redis and
SQLite in a temporary directory, the migrations applied, the app context, one key per role and
an HTTP client on the app (httpx's ASGI transport, no socket). Shared by every benchmark that
runs the service in process (accuracy's HTTP arm, roll, seal, selection, re-identification on
MovieLens, stream creation); ``bench speed`` measures a real server in a subprocess instead
(``bench.speed.server``)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import httpx

from service import resources
from service.admin import service as keys_service
from service.app import create_app
from service.coldstore import service as coldstore
from service.config import Settings
from service.context import AppContext
from service.db.migrate import upgrade
from service.lifecycle import followups

ROLES = ("admin", "producer", "model")
PREFIX = "bench"  # the Redis key prefix (another process on the same Redis uses it too)


class InProcess:
    """``async with InProcess() as svc``: ``svc.ctx`` (the app context), ``svc.keys``
    (role → key), ``svc.call`` (an API call that checks its status), ``svc.settle`` (the
    worker's part of what requests started). CPU work, noise and models run in threads of this
    process (the context has no process pool); ``http_timeout`` bounds ``svc.client``'s calls."""

    def __init__(self, *, http_timeout: float | None = None) -> None:
        self.http_timeout = http_timeout

    async def __aenter__(self) -> InProcess:
        self._tmp = tempfile.TemporaryDirectory(prefix="selectivity-bench-")
        self.settings = Settings(
            env="development",
            data_dir=Path(self._tmp.name),
            redis_url=None,  # the embedded Redis and SQLite, whatever the environment says
            database_url=None,
            redis_prefix=PREFIX,
            embedded_worker=False,
        )
        upgrade(self.settings.resolved_database_url)
        self.embedded = resources.EmbeddedRedis(self.settings)
        self.ctx: AppContext = await resources.build(self.settings, embedded=self.embedded)
        # ingest refuses batches without a cold-store key; its shares stay in memory
        _, self.cold_shares = await coldstore.init_key(
            sessionmaker=self.ctx.sessionmaker, shares=3, threshold=2, actor="bench"
        )
        self.keys: dict[str, str] = {}
        async with self.ctx.sessionmaker() as session, session.begin():
            for role in ROLES:
                self.keys[role] = (await keys_service.create(session=session, role=role)).key
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(ctx=self.ctx)),
            base_url="http://bench",
            timeout=self.http_timeout,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        await resources.close(self.ctx)
        self.embedded.close()
        self._tmp.cleanup()

    async def call(
        self, method: str, url: str, role: str, status: int = 200, **kw: Any
    ) -> httpx.Response:
        """``method /v1{url}`` with ``role``'s key; anything but ``status`` raises."""
        headers = {"Authorization": f"Bearer {self.keys[role]}"}
        r = await self.client.request(method, f"/v1{url}", headers=headers, **kw)
        if r.status_code != status:
            raise RuntimeError(f"{method} {url}: {r.status_code} {r.text[:500]}")
        return r

    async def settle(self, name: str | None = None) -> int:
        """Do here and now what the worker would do after a request: run the roll follow-ups
        that are due (the next window's noise, the selection round, the reference model,
        webhooks), of stream ``name`` or of every stream, until none is left. Returns how many
        ran."""
        ran = 0
        while True:
            due = [(k, n, e) for k, n, e in await followups.pending(self.ctx) if name in (None, n)]
            if not due:
                return ran
            for kind, stream, epoch in due:
                await followups.run(self.ctx, kind=kind, name=stream, epoch=epoch)
                ran += 1

    async def forget(self, name: str) -> None:
        """Free a stream's Redis memory once the benchmark is done with it (the service has no
        stream deletion; the benchmark owns this Redis)."""
        prefix = self.settings.redis_prefix
        for pattern in (f"{prefix}:{{{name}}}:*", f"{prefix}:{{{name}:*"):
            batch = [k async for k in self.ctx.redis.scan_iter(match=pattern, count=1000)]
            for lo in range(0, len(batch), 1000):
                await self.ctx.redis.delete(*batch[lo : lo + 1000])
