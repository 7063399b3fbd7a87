"""Engines and sessions. The request owns the transaction (see ``service.api.deps``)."""

from __future__ import annotations

import logging

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from service.config import Settings

# aiosqlite's DEBUG records print every statement with its parameters (reference models, which
# hold raw values; key hashes): never emitted, whatever the root level (promise 1)
logging.getLogger("aiosqlite").setLevel(logging.INFO)


def async_url(url: str) -> str:
    """The async driver URL for a configured (sync-style) database URL."""
    if url.startswith("sqlite:///"):
        return "sqlite+aiosqlite:///" + url.removeprefix("sqlite:///")
    for prefix in ("postgresql://", "postgres://", "postgresql+psycopg2://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url.removeprefix(prefix)
    return url


def sync_url(url: str) -> str:
    """The sync driver URL (Alembic), for a configured database URL."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url.removeprefix(prefix)
    return url.replace("+aiosqlite", "")


def make_engine(url: str) -> AsyncEngine:
    engine = create_async_engine(async_url(url), pool_pre_ping=True)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=10000")
            # deleted rows are overwritten with zeros, not left in free pages (promise 1)
            cur.execute("PRAGMA secure_delete=ON")
            cur.close()

    return engine


async def scrub_deleted(engine: AsyncEngine) -> bool:
    """After rows holding data derived from raw observations were deleted: on SQLite, copy
    the WAL into the database file (whose deleted content ``secure_delete`` has zeroed) and
    truncate it, so that no copy of the old pages stays in ``-wal``. False when a reader kept
    the WAL busy (the next call retries) and on other databases, where deleted rows stay in
    the data files and the WAL until they are vacuumed and overwritten
    (docs/ARCHITECTURE.md, "Threat model and promises", promise 1)."""
    if engine.dialect.name != "sqlite":
        return False
    async with engine.connect() as conn:
        result = (await conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")).one()
    return result[0] == 0  # (busy, WAL frames, frames checkpointed)


def make_sessionmaker(engine: AsyncEngine, settings: Settings | None = None) -> async_sessionmaker:
    """Sessions on ``engine``; with ``settings``, each session carries them in
    ``session.info["settings"]`` (the audit log finds its key and anchor there)."""
    info = {"settings": settings} if settings is not None else None
    return async_sessionmaker(engine, expire_on_commit=False, info=info)
