"""Expiry holds no SQL write transaction while it counts and deletes in Redis
(docs/ARCHITECTURE.md, "Life cycle"): on SQLite such a transaction holds the only write lock,
and every other writer (keys, unlock requests, rolls of other streams) waits behind it."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from service.coldstore import service as coldstore
from service.counting import service as counting
from tests.conftest import Api, Jobs
from tests.helpers import ingest, new_stream


def _write_lock_free(path: str) -> bool:
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


async def test_expiry_counts_and_deletes_with_the_write_lock_free(
    api: Api, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    if api.ctx.engine.dialect.name != "sqlite":
        pytest.skip("SQLite's database-wide write lock")
    path = api.ctx.settings.resolved_database_url.removeprefix("sqlite:///")
    name = await new_stream(api, "exp", hot_windows=1, retention_windows=1)
    for w in range(3):  # three windows, closed but not sealed: their hot data is kept
        await ingest(api, name, [{"features": {"user": f"u{w}", "item": "i"}, "label": "1"}])
        assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    await jobs()  # the selection rounds that would keep their windows' hot data
    seen: list[bool] = []
    real = counting.count_window

    async def watched(**kw: Any) -> Any:
        seen.append(_write_lock_free(path))
        return await real(**kw)

    monkeypatch.setattr(counting, "count_window", watched)
    stats = await coldstore.seal_stream(ctx=api.ctx, name=name)  # seals 1-3, then expires
    assert stats.windows_sealed == 3
    windows = (await api.get(f"/v1/streams/{name}/windows")).json()["windows"]
    assert sum(1 for w in windows if w["hot_deleted_at"]) >= 2
    assert len(seen) >= 2 and all(seen), seen
