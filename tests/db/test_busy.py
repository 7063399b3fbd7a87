"""A database locked by another writer past the wait is a 503 with Retry-After, never a 500
(``service.db.session.is_busy``, the app's handler)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.conftest import Backend, fresh_context, in_process_api


async def test_a_locked_database_is_a_503_with_retry_after(
    backend: Backend, tmp_path: Path
) -> None:
    if backend.settings.database_url:
        pytest.skip("SQLite's write lock (PostgreSQL locks rows, not the database)")
    async with (
        fresh_context(backend, tmp_path, sqlite_busy_timeout_seconds=0.2) as ctx,
        in_process_api(ctx, roles=("admin", "analyst")) as api,
    ):
        holder = sqlite3.connect(ctx.settings.resolved_database_url.removeprefix("sqlite:///"))
        holder.isolation_level = None
        holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            r = await api.post("/v1/admin/keys", json={"role": "analyst"})
            assert r.status_code == 503, r.text
            assert r.headers["Retry-After"] == "2"
            body = r.json()
            assert body["error"] == "DatabaseBusy" and "0.2 s" in body["detail"]
            # reads go on (WAL)
            assert (await api.get("/v1/streams", "analyst")).status_code == 200
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        r = await api.post("/v1/admin/keys", json={"role": "analyst"})
        assert r.status_code == 201, r.text
