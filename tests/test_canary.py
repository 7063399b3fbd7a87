"""Canary of issue 12, items 1 and 2 (docs/ARCHITECTURE.md, "Threat model and promises",
promise 1): a unique raw value planted in a window is found nowhere the service can read once
that window left the hot period: not in Redis (every key of the run, the job queue's too), the
AOF, the SQL database (its live rows; on SQLite also the database file's free pages, the WAL
and the shared-memory file), the data dir, or the logs.

The value is a passthrough numeric feature and the largest of its column, so the reference
model trained on the window holds it verbatim (LightGBM's ``feature_infos`` keeps every
feature's exact minimum and maximum; its split thresholds are midpoints of raw values)."""

from __future__ import annotations

import logging
import secrets
import struct

import numpy as np
import pytest
from sqlalchemy import select, text

from service.coldstore import service as coldstore
from service.db.models import Stream, Window
from tests.conftest import Api, Backend, Jobs
from tests.helpers import aof_rewritten, ingest, new_stream, redis_dump, sql_dump


def _rows(rng: np.random.Generator, n: int) -> list[dict]:
    users = rng.integers(0, 20, n)
    ages = rng.integers(18, 70, n)
    labels = np.where(rng.random(n) < np.where(users % 2 == 0, 0.8, 0.2), "1", "0")
    return [
        {"features": {"user": f"u{u}", "item": "i", "age": int(a)}, "label": str(y)}
        for u, a, y in zip(users, ages, labels, strict=True)
    ]


async def test_a_planted_raw_value_is_nowhere_once_its_window_left_the_hot_period(
    api: Api, jobs: Jobs, backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = api.ctx
    caplog.set_level(logging.DEBUG)
    canary = 600_000 + secrets.randbelow(300_000) + 0.375  # exact in binary: printed as is
    forms = [repr(canary).encode(), struct.pack("<d", canary), struct.pack(">d", canary)]

    def holds(blob: bytes) -> bool:
        return any(f in blob for f in forms)

    rng = np.random.default_rng(11)
    name = await new_stream(api, "canary", hot_windows=2, retention_windows=3)
    window1 = _rows(rng, 400)
    window1[3]["features"]["age"] = canary  # the column's maximum, among the fitted rows
    assert await ingest(api, name, window1) == 1
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200  # epoch 2: [1, 2]
    await jobs()  # the reference model of epoch 2, trained on window 1

    # while window 1 is hot, the checks below can see the canary where it is
    async with ctx.sessionmaker() as s:
        stream = await s.scalar(select(Stream).where(Stream.name == name))
        assert stream is not None
        model = await s.scalar(
            text("SELECT model FROM reference_model WHERE stream_id = :s AND epoch = 2"),
            {"s": stream.id},
        )
    assert model is not None and repr(canary) in model
    assert holds(await sql_dump(ctx))
    assert holds(await redis_dump(ctx))
    r = await api.post(f"/v1/streams/{name}/predict", role="model", json={"rows": [{"age": 30}]})
    assert r.status_code == 200 and r.json()["model_epoch"] == 2
    q = (await api.get(f"/v1/streams/{name}/quality", role="model")).json()
    assert [p["epoch"] for p in q["epochs"]] == [2] and q["epochs"][0]["train_rows"] == 320

    assert await ingest(api, name, _rows(rng, 400)) == 2
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200  # epoch 3: [2, 3]
    # window 1 left the hot period: its model is gone, and no older model stands in
    r = await api.post(f"/v1/streams/{name}/predict", role="model", json={"rows": [{"age": 30}]})
    assert r.status_code == 503
    assert "no reference model for the current hot period" in r.json()["detail"]
    assert (await api.get(f"/v1/streams/{name}/quality", role="model")).json()["epochs"] == []
    assert not holds(await sql_dump(ctx))
    data_dir = backend.settings.data_dir.resolve()
    if ctx.engine.dialect.name == "sqlite":  # before a new model can reuse the freed pages
        db = data_dir / "selectivity.db"
        for p in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            assert not (p.exists() and holds(p.read_bytes())), p
    await jobs()  # epoch 3's model, trained on window 2
    r = await api.post(f"/v1/streams/{name}/predict", role="model", json={"rows": [{"age": 30}]})
    assert r.status_code == 200 and r.json()["model_epoch"] == 3
    q = (await api.get(f"/v1/streams/{name}/quality", role="model")).json()
    assert [p["epoch"] for p in q["epochs"]] == [3]
    # the seal job seals window 1 and expire deletes its hot rows (then rewrites the AOF)
    assert (await coldstore.seal_stream(ctx=ctx, name=name)).windows_sealed >= 1
    async with ctx.sessionmaker() as s:
        w1 = await s.scalar(select(Window).where(Window.stream_id == stream.id, Window.epoch == 1))
        assert w1 is not None and w1.hot_deleted_at is not None

    assert not holds(await redis_dump(ctx))
    assert not holds(await sql_dump(ctx))
    if backend.embedded is not None:
        await aof_rewritten(ctx)
    files = [p for p in data_dir.rglob("*") if p.is_file()]
    if backend.embedded is not None:
        assert any("aof" in p.name for p in files)
    if ctx.engine.dialect.name == "sqlite":
        assert data_dir / "selectivity.db" in files
    for p in files:
        assert not holds(p.read_bytes()), p
    assert repr(canary) not in caplog.text
