"""Engines and sessions. The request owns the transaction (see ``service.api.deps``)."""

from __future__ import annotations

import logging
import re

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
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


class DatabaseURLError(ValueError):
    """A database URL that names no database the service can open: malformed, of an unknown
    kind, or whose driver is not installed. The message shows the URL with its password
    masked."""


EXAMPLE_URLS = "postgresql://user:password@host:5432/db or sqlite:////path/to/selectivity.db"


def masked_url(url: str) -> str:
    """``url`` fit for a message or a log: its password replaced by ``***`` (SQLAlchemy's
    rendering); when it does not parse, everything before its last ``@`` but the scheme."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"^([A-Za-z][\w+.-]*://)?.*@", lambda m: f"{m[1] or ''}***@", url, flags=re.S)


def check_url(url: str) -> None:
    """Raise ``DatabaseURLError`` unless ``url`` (a configured URL, as ``async_url`` takes it)
    parses, names a known kind of database and its driver is installed: a clear error before
    any connection is tried, instead of the parser's or an import's traceback."""
    shown = masked_url(url)
    try:
        dialect = make_url(async_url(url)).get_dialect()
    except NoSuchModuleError:
        kind = url.split(":", 1)[0]
        raise DatabaseURLError(
            f"unknown kind of database {kind!r} in {shown!r} (expected {EXAMPLE_URLS})"
        ) from None
    except (ArgumentError, ValueError):  # not a URL; a port that is not a number
        raise DatabaseURLError(f"not a database URL: {shown!r} (expected {EXAMPLE_URLS})") from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise DatabaseURLError(
            f"the driver of {shown!r} is not installed ({exc}); expected {EXAMPLE_URLS}"
        ) from None


BUSY_TIMEOUT_SECONDS = 10.0  # the default of ``Settings.sqlite_busy_timeout_seconds``
RETRY_AFTER_SECONDS = 2  # what a 503 for a busy database tells the client
# SQLite's SQLITE_BUSY / SQLITE_LOCKED texts; PostgreSQL's lock_not_available (lock_timeout)
_BUSY_TEXTS = ("database is locked", "database table is locked", "database is busy")
_BUSY_SQLSTATES = frozenset({"55P03"})


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` (a SQLAlchemy ``OperationalError``) says the database stayed locked by
    another writer past the wait (``busy_timeout`` on SQLite): the caller answers 503 with
    ``Retry-After``, never 500. Only the driver's error code and fixed text are read."""
    orig = getattr(exc, "orig", None)
    if orig is None:
        return False
    if getattr(orig, "sqlstate", None) in _BUSY_SQLSTATES:
        return True
    text = str(orig.args[0]) if getattr(orig, "args", None) else ""
    return text in _BUSY_TEXTS or getattr(orig, "sqlite_errorname", "") in (
        "SQLITE_BUSY",
        "SQLITE_LOCKED",
    )


def make_engine(url: str, *, busy_timeout_seconds: float = BUSY_TIMEOUT_SECONDS) -> AsyncEngine:
    """An engine on ``url`` (``DatabaseURLError`` when it names no database it can open). On
    SQLite a statement that finds the write lock taken waits up to ``busy_timeout_seconds``
    (SQLite retries meanwhile), then fails with "database is locked" (``is_busy``)."""
    check_url(url)
    # hide_parameters: an error's text (str(exc), a traceback) never shows the statement's
    # parameters, which hold rows of reference models, queue records, key hashes (promise 1)
    engine = create_async_engine(async_url(url), pool_pre_ping=True, hide_parameters=True)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_seconds * 1000)}")
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
    (docs/PRIVACY.md, promise 1)."""
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
