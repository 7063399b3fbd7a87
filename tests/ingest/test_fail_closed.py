"""Ingest fails closed without a cold-store key (docs/ARCHITECTURE.md, "Threat model and
promises", promise 1; issue 12 item 3): nothing could be sealed, so hot data would never be
deleted. A first start refuses every batch with 503 until the key ceremony has run, and the
check costs one SQL look-up per API process once a key exists."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from service.coldstore import service as coldstore
from service.context import AppContext
from tests.conftest import Api, Backend, fresh_context, in_process_api, unique
from tests.helpers import obs, stream_body

BATCH = {"observations": [obs("u1", "i1", 20, "1"), obs("u2", "i2", 30, "0")]}


@contextmanager
def key_lookups(engine: AsyncEngine) -> Iterator[list[str]]:
    """The SQL statements on ``engine`` that read the cold-store key table, while open."""
    seen: list[str] = []

    def spy(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if "coldstore_key" in statement:
            seen.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", spy)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", spy)


async def _ingest(api: Api, name: str) -> Any:
    return await api.post(f"/v1/streams/{name}/observations", "producer", json=BATCH)


async def test_ingest_answers_503_until_a_cold_store_key_exists(
    backend: Backend, tmp_path: Path
) -> None:
    async with fresh_context(backend, tmp_path / "data") as ctx, in_process_api(ctx) as api:
        name = unique("closed")
        assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
        with key_lookups(ctx.engine) as seen:
            for _ in range(3):
                r = await _ingest(api, name)
                assert r.status_code == 503, r.text
                assert r.json()["detail"].startswith("no cold-store key: run the key ceremony")
        assert len(seen) == 1  # "no key" is trusted for a second: one look-up, not one a batch
        assert await ctx.stores.windows.hot_length(name, 1) == 0  # nothing was accepted
        await coldstore.init_key(sessionmaker=ctx.sessionmaker, shares=3, threshold=2, actor="test")
        deadline = time.monotonic() + 5  # the cached "no key" lapses within a second
        while (r := await _ingest(api, name)).status_code == 503:
            assert time.monotonic() < deadline, r.text
            await asyncio.sleep(0.05)
        assert r.status_code == 202, r.text
        assert await ctx.stores.windows.hot_length(name, 1) == 2


async def test_once_a_key_exists_the_check_costs_no_query(ctx: AppContext) -> None:
    """The session's backend has a key (tests/conftest.py); a fresh context (a new API
    process) looks it up once, then never again."""
    async with in_process_api(ctx) as api:
        name = unique("keyed")
        assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
        with key_lookups(ctx.engine) as seen:
            for _ in range(5):
                assert (await _ingest(api, name)).status_code == 202
        assert len(seen) == 1
