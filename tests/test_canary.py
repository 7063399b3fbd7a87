"""Canary of issue 12, items 1 and 2 (docs/PRIVACY.md,
promise 1): a unique raw value planted in a window is found nowhere the service can read once
that window left the hot period: not in Redis (every key of the run, the job queue's too), the
AOF, the SQL database (its live rows; on SQLite also the database file's free pages, the WAL
and the shared-memory file), the data dir, or the logs.

The value is a passthrough numeric feature and the largest of its column, so the reference
model trained on the window holds it verbatim (LightGBM's ``feature_infos`` keeps every
feature's exact minimum and maximum; its split thresholds are midpoints of raw values).

The second test sends a canary string in rows of a user-keyed stream and through the error
paths (``tests/test_log_filter.py`` covers each path alone), into a k-anonymised release and a
re-identification audit of the hot period, and looks for it everywhere after the roll that ends
that hot period, the seal and the expiry."""

from __future__ import annotations

import logging
import random
import re
import secrets
import struct

import httpx
import numpy as np
import pytest
from sqlalchemy import select, text

from service.app import create_app
from service.coldstore import service as coldstore
from service.db.models import Stream, Window
from service.streams import service as streams_service
from tests.conftest import Api, Backend, Jobs
from tests.helpers import aof_rewritten, ingest, new_stream, obs, redis_dump, sql_dump
from tests.test_log_filter import rendered
from workers.jobs import anonymize_run, reidentification_run


def _rows(rng: np.random.Generator, n: int) -> list[dict]:
    users = rng.integers(0, 20, n)
    ages = rng.integers(18, 70, n)
    labels = np.where(rng.random(n) < np.where(users % 2 == 0, 0.8, 0.2), "1", "0")
    return [
        {"features": {"user": f"u{u}", "item": "i", "age": int(a)}, "label": str(y)}
        for u, a, y in zip(users, ages, labels, strict=True)
    ]


@pytest.mark.slow  # end to end through hot period, roll, seal and expiry, every store dumped
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


@pytest.mark.slow  # end to end through every row and error path, every store dumped
async def test_a_canary_through_rows_and_error_paths_is_nowhere_after_its_hot_period(
    api: Api,
    jobs: Jobs,
    backend: Backend,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A raw value in rows of a user-keyed stream (its user key, a releasable feature, the
    batch's Idempotency-Key), in a k-anonymised release and a re-identification audit of the
    hot period, and through the error paths (bad headers, an exception in a request, a
    database error with it as a parameter): once the roll ended that hot period and the window
    was sealed and expired, it is in no Redis value, no AOF file, no SQL row, no SQLite file,
    no file of the data dir, no log record and no response body."""
    ctx = api.ctx
    caplog.set_level(logging.DEBUG)
    canary = f"CANARY-{secrets.token_hex(6)}"
    blob = canary.encode()
    bodies: list[str] = []
    name = await new_stream(
        api,
        "canaryk",
        privacy={"mechanism": "none", "user_key": "user"},
        releasable=["age", "item", "label"],
        hot_windows=1,
        retention_windows=3,
    )
    rng = random.Random(5)

    def rows(n: int, tag: str) -> list[dict]:
        return [
            obs(f"{tag}u{i % 9}", f"{tag}i{i % 4}", rng.randint(18, 70), "01"[i % 3 == 0])
            for i in range(n)
        ]

    assert await ingest(api, name, rows(80, "a")) == 1
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    await jobs()
    url = f"/v1/streams/{name}/observations"
    planted = [obs(f"{canary}-user", f"{canary}-item", 33, "1") for _ in range(3)]
    r = await api.post(
        url,
        "producer",
        json={"observations": [*planted, *rows(60, "b")]},
        headers={"Idempotency-Key": f"{canary}-batch"},
    )
    assert r.status_code == 202 and r.json()["window"] == 2, r.text
    bodies.append(r.text)

    # the error paths, while the window is hot
    one = {"observations": rows(1, "c")}
    for headers in (
        {"Content-Type": f"text/{canary}"},
        {"Authorization": f"Bearer {canary}"},
        {"Idempotency-Key": canary * 20},
    ):
        r = await api.client.post(url, json=one, headers={**api.auth("producer"), **headers})
        assert 400 <= r.status_code < 500, r.text
        bodies.append(r.text)

    async def broken(**_: object) -> None:
        raise RuntimeError(f"listing failed at {canary}")

    monkeypatch.setattr(streams_service, "list_out", broken)
    transport = httpx.ASGITransport(app=create_app(ctx=ctx), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        r = await client.get("/v1/streams", headers=api.auth("admin"))
    assert r.status_code == 500
    bodies.append(r.text)
    monkeypatch.undo()
    async with ctx.sessionmaker() as s:
        try:
            await s.execute(text("SELECT * FROM no_such_table WHERE x = :v"), {"v": canary})
        except Exception:
            logging.getLogger("selectivity.queues").exception("releasing queue q failed")

    # result stores of the hot period: a k-anonymised release and a re-identification audit
    r = await api.post(
        "/v1/anonymizations",
        "analyst",
        json={
            "source": {"stream": name},
            "k": 2,
            "quasi_identifiers": [{"name": "age", "kind": "range"}],
            "keep": ["item", "label"],
        },
    )
    assert r.status_code == 202, r.text
    release = r.json()["id"]
    assert (await anonymize_run({"app": ctx}, id=release))["status"] == "done"
    r = await api.get(f"/v1/anonymizations/{release}/result?format=csv", "analyst")
    assert r.status_code == 200 and canary in r.text  # the release holds it while hot
    r = await api.post(
        "/v1/audits/reidentification",
        "analyst",
        json={
            "source": {"stream": name},
            "positive_label": "1",
            "release": {"kind": "count_tables"},
            "attacks": ["kmeans"],
        },
    )
    assert r.status_code == 202, r.text
    audit = r.json()["id"]
    assert (await reidentification_run({"app": ctx}, id=audit))["status"] == "done"
    assert blob in await redis_dump(ctx)  # the hot rows, the release

    # the roll that ends window 2's hot period, its follow-ups, then seal and expire
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 3}
    await jobs()
    assert (await coldstore.seal_stream(ctx=ctx, name=name)).windows_sealed >= 1
    async with ctx.sessionmaker() as s:
        sid = await s.scalar(select(Stream.id).where(Stream.name == name))
        w2 = await s.scalar(select(Window).where(Window.stream_id == sid, Window.epoch == 2))
        assert w2 is not None and w2.hot_deleted_at is not None

    keys = [k async for k in ctx.redis.scan_iter(match=f"*{{{name}:2}}*", count=1000)]
    # the Idempotency-Key's record outlives the hot period (until its TTL): keyed hashes and
    # the response only
    for key in [k for k in keys if b":idem" in k]:
        for field, value in (await ctx.redis.hgetall(key)).items():
            assert re.fullmatch(rb"[0-9a-f]{32}", field), field
            assert re.fullmatch(rb'[0-9a-f]{64}\{"accepted":\d+,"window":\d+\}', value), value
    for path in (f"/v1/anonymizations/{release}", f"/v1/audits/reidentification/{audit}"):
        assert (await api.get(path, "analyst")).status_code == 404, path
    dump = await redis_dump(ctx)
    assert blob not in dump, dump[max(0, dump.find(blob) - 200) : dump.find(blob) + 100]
    assert blob not in await sql_dump(ctx)
    if backend.embedded is not None:
        await aof_rewritten(ctx)
    data_dir = backend.settings.data_dir.resolve()
    files = [p for p in data_dir.rglob("*") if p.is_file()]
    if backend.embedded is not None:
        assert any("aof" in p.name for p in files)
    for p in files:  # the AOF, the SQLite database with its WAL and shm, everything
        assert blob not in p.read_bytes(), p
    for record in caplog.records:
        assert canary not in rendered(record), (record.name, rendered(record))
    for body in bodies:
        assert canary not in body
