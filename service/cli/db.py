"""The CLI's database side: ``reported_errors``, which ``service.cli.entry.main`` wraps around every
command so that a database that cannot be reached, refuses the login, does not exist, is not
migrated or is misconfigured is one line on stderr (naming the database, its password masked,
and the fix) and an exit status, never a traceback. A query's own failure (a bug) keeps its
traceback.

Exit statuses as ``service.cli.http``'s: 1 when the database could not be used, 2 for a
``SELECTIVITY_DATABASE_URL`` that names no database (malformed, an unknown kind, a driver that
is not installed)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.cli.http import SERVER_ERROR, USAGE_ERROR
from service.config import Settings
from service.db.session import DatabaseURLError, check_url, make_engine, masked_url

ENV = "SELECTIVITY_DATABASE_URL"

_UNRESOLVED = ("failed to resolve host", "could not translate host name", "name or service not")
_LOGIN = ("password authentication", "no password supplied", "authentication failed", "pg_hba")


def _reason(exc: DBAPIError, url: str | None) -> str:
    """The driver's message, first line, without libpq's preamble and never the password."""
    text = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
    text = text.rpartition(" failed: ")[2] if text.startswith("connection failed") else text
    text = " ".join(text.removeprefix("FATAL:").split()) or type(exc.orig).__name__
    try:
        password = make_url(url).password if url else None
    except (ArgumentError, ValueError):
        password = None
    return text.replace(str(password), "***") if password else text


def describe(exc: BaseException, url: str | None) -> tuple[str, int] | None:
    """One line for a failure to use the database at ``url`` (the configured URL), and the exit
    status; None for anything else, which keeps its traceback."""
    if isinstance(exc, DatabaseURLError):
        return f"error: bad {ENV}: {exc}", USAGE_ERROR
    if not isinstance(exc, DBAPIError):
        return None
    where = f"the database at {masked_url(url)}" if url else "the database"
    reason = _reason(exc, url)
    low = reason.lower()
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate == "42501" or "readonly database" in low:  # insufficient_privilege
        return (
            f"error: {where} refused the operation ({reason}); grant the user the rights "
            f"it needs, or set {ENV} to one that has them",
            SERVER_ERROR,
        )
    if sqlstate == "42P01" or low.startswith("no such table"):  # undefined_table
        return (
            f"error: {where} lacks a table ({reason}); is it migrated? (selectivity migrate)",
            SERVER_ERROR,
        )
    if exc.statement is not None:  # a statement's failure, not the connection's
        if exc.connection_invalidated:  # the server went away
            return f"error: lost the connection to {where} ({reason}); is it running?", SERVER_ERROR
        return None
    if "connection refused" in low:
        return (
            f"error: cannot reach {where} (connection refused); is it running? check {ENV}",
            SERVER_ERROR,
        )
    if any(s in low for s in _UNRESOLVED):
        return f"error: cannot reach {where} ({reason}); check the host in {ENV}", SERVER_ERROR
    if "timeout" in low or "timed out" in low:
        return (
            f"error: cannot reach {where} (no answer in time); is the host up and the port "
            f"open? check {ENV}",
            SERVER_ERROR,
        )
    if "database" in low and "does not exist" in low:
        return f"error: cannot use {where}: {reason}; create it or check {ENV}", SERVER_ERROR
    if ("role" in low and "does not exist" in low) or any(s in low for s in _LOGIN):
        return (
            f"error: {where} refused the login ({reason}); check the user and password in {ENV}",
            SERVER_ERROR,
        )
    if "unable to open database file" in low:  # SQLite
        return (
            f"error: cannot open {where} ({reason}); does its directory exist, and may this "
            f"user write it? check {ENV}",
            SERVER_ERROR,
        )
    return f"error: cannot connect to {where} ({reason}); check {ENV}", SERVER_ERROR


def engine(url: str) -> AsyncEngine:
    """``make_engine(url)`` for a command that uses an existing database. An SQLite file that is
    not there is reported here, before the event loop: aiosqlite's failure to open one races the
    loop's end and prints its thread's traceback (aiosqlite 0.22)."""
    check_url(url)
    u = make_url(url)
    sqlite_file = u.get_backend_name() == "sqlite" and "uri" not in u.query
    if sqlite_file and u.database and u.database != ":memory:":
        path = Path(u.database)
        if not path.is_file():
            message = (
                f"error: no database at {masked_url(url)} ({path} is not a file); "
                f"run `selectivity migrate` first, or check {ENV}"
            )
            print(" ".join(message.split()), file=sys.stderr, flush=True)
            raise SystemExit(SERVER_ERROR)
    return make_engine(url)


def _configured_url() -> str | None:
    try:
        return Settings().resolved_database_url
    except Exception:  # the command has reported a bad configuration already
        return None


@contextmanager
def reported_errors() -> Iterator[None]:
    """Run a command; a database failure that escapes it becomes one line on stderr and its
    exit status (``describe``), not a traceback."""
    try:
        yield
    except (DatabaseURLError, DBAPIError) as exc:
        found = describe(exc, _configured_url())
        if found is None:
            raise
        message, status = found
        print(" ".join(message.split()), file=sys.stderr, flush=True)
        raise SystemExit(status) from None
