"""Stream creation holds no SQL transaction while it prepares its windows in Redis
(docs/ARCHITECTURE.md, "Life cycle"): other writers go on meanwhile, the stream is invisible
until ready, and a creation that died is finished by a retry or cleaned by the scheduler."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from service.core.streamconfig import StreamCreate
from service.db.models import CountTable, Stream
from service.lifecycle import scheduler
from service.lifecycle import streams as lifecycle_streams
from service.windows import service as windows
from tests.conftest import Api, Backend, fresh_context, in_process_api, unique
from tests.helpers import stream_body

ROW = {"observations": [{"features": {"user": "u", "item": "i", "age": 30}, "label": "1"}]}


async def _rows(api: Api, name: str) -> list[Stream]:
    async with api.ctx.sessionmaker() as s:
        return list(await s.scalars(select(Stream).where(Stream.name == name)))


async def test_other_writers_go_on_while_a_stream_prepares_its_windows(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a creation is inside its Redis preparation, a key is created at once (on SQLite
    a creation held the only write lock: 500 after the busy timeout), and the stream is
    invisible: 404 to reads and to ingest, absent from the list, 409 to a second creation."""
    name = unique("slow")
    entered, gate = asyncio.Event(), asyncio.Event()
    real = windows.prepare

    async def held(**kw: Any) -> bool:
        entered.set()
        await gate.wait()
        return await real(**kw)

    monkeypatch.setattr(windows, "prepare", held)
    creating = asyncio.create_task(api.post("/v1/streams", json=stream_body(name)))
    await asyncio.wait_for(entered.wait(), 60)
    try:
        r = await api.post("/v1/admin/keys", json={"role": "analyst"})
        assert r.status_code == 201, r.text
        assert (await api.get(f"/v1/streams/{name}", "producer")).status_code == 404
        names = [s["name"] for s in (await api.get("/v1/streams")).json()["streams"]]
        assert name not in names
        r = await api.post(f"/v1/streams/{name}/observations", "producer", json=ROW)
        assert r.status_code == 404, r.text
        r = await api.post("/v1/streams", json=stream_body(name))
        assert r.status_code == 409 and "being created" in r.json()["detail"], r.text
        [row] = await _rows(api, name)
        assert row.state == "creating"
    finally:
        gate.set()
    r = await creating
    assert r.status_code == 201, r.text
    [row] = await _rows(api, name)
    assert row.state == "ready" and row.epoch_started_at >= row.created_at
    r = await api.post(f"/v1/streams/{name}/observations", "producer", json=ROW)
    assert r.status_code == 202 and r.json()["window"] == 1, r.text


async def _abandoned(api: Api, monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """A creation that dies after window 1 is in Redis (as a killed process would leave it:
    nothing discarded; its lock expires): the ids of its tables."""
    real = windows.prepare

    async def dies_at_window_2(**kw: Any) -> bool:
        if kw["epoch"] == 2:
            raise RuntimeError("killed")
        return await real(**kw)

    async def no_cleanup(*_: Any) -> None:
        return None

    with monkeypatch.context() as m:
        m.setattr(windows, "prepare", dies_at_window_2)
        m.setattr(lifecycle_streams, "_discard", no_cleanup)
        with pytest.raises(RuntimeError):
            await lifecycle_streams.create(
                ctx=api.ctx, stream_in=StreamCreate.model_validate(stream_body(name))
            )
    [row] = await _rows(api, name)
    assert row.state == "creating"
    async with api.ctx.sessionmaker() as s:
        ids = list(await s.scalars(select(CountTable.id).where(CountTable.stream_id == row.id)))
    store = api.ctx.stores.windows
    assert await store.state(name, 1) == "open" and await store.epoch(name) == 1
    return ids


async def test_an_abandoned_creation_is_refused_then_finished_by_a_retry(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique("retry")
    await _abandoned(api, monkeypatch, name)
    r = await api.post(f"/v1/streams/{name}/observations", "producer", json=ROW)
    assert r.status_code == 404
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 404
    r = await api.post("/v1/streams", json=stream_body(name))
    assert r.status_code == 201, r.text
    [row] = await _rows(api, name)
    assert row.state == "ready"
    r = await api.post(f"/v1/streams/{name}/observations", "producer", json=ROW)
    assert r.status_code == 202 and r.json()["window"] == 1, r.text
    assert await api.ctx.stores.windows.state(name, 2) == "prepared"


async def test_the_scheduler_removes_an_abandoned_creation(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique("gone")
    ids = await _abandoned(api, monkeypatch, name)
    result = await scheduler.tick(api.ctx)
    assert result["abandoned_creations"] >= 1
    assert await _rows(api, name) == []
    store = api.ctx.stores.windows
    keys = [api.ctx.keys.table(name, 1, t) for t in ids] + [
        api.ctx.keys.prior(name, 1),
        api.ctx.keys.meta(name, 1),
        api.ctx.keys.epoch(name),
        api.ctx.keys.served(name),
        api.ctx.keys.agg(name, 1),
    ]
    assert await api.ctx.redis.exists(*keys) == 0
    assert await store.epoch(name) is None
    # the name is free again
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201


async def test_a_creation_that_fails_leaves_nothing(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique("fails")
    real = windows.prepare

    async def fails_at_window_2(**kw: Any) -> bool:
        if kw["epoch"] == 2:
            raise ConnectionError("redis went away")
        return await real(**kw)

    monkeypatch.setattr(windows, "prepare", fails_at_window_2)
    with pytest.raises(ConnectionError):  # a 500 over HTTP
        await lifecycle_streams.create(
            ctx=api.ctx, stream_in=StreamCreate.model_validate(stream_body(name))
        )
    assert await _rows(api, name) == []
    assert await api.ctx.stores.windows.epoch(name) is None
    assert await api.ctx.stores.windows.state(name, 1) is None


@pytest.mark.slow
async def test_a_big_sketch_never_makes_other_writers_fail(
    backend: Backend, tmp_path: Path
) -> None:
    """A stream with a large sketch (2^20 × 8 cells per table, three tables and the prior,
    two windows) is created while admins keep creating keys, with a busy timeout of 0.5 s:
    every key answers 201 (a creation holding the write lock made them 500)."""
    async with (
        fresh_context(backend, tmp_path, sqlite_busy_timeout_seconds=0.5) as ctx,
        in_process_api(ctx, roles=("admin",)) as api,
    ):
        body = stream_body(unique("big"), sketch={"width": 2**20, "depth": 8}, max_tables=4)
        creating = asyncio.create_task(api.post("/v1/streams", json=body))
        answers = []
        while not creating.done():
            answers.append(await api.post("/v1/admin/keys", json={"role": "analyst"}))
            await asyncio.sleep(0.05)
        r = await creating
        assert r.status_code == 201, r.text
        assert len(answers) >= 3  # the creation took a while
        assert {a.status_code for a in answers} == {201}, [a.text for a in answers[:3]]
