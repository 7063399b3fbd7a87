"""A release and the labels of its tasks never race, and no queue error path puts a payload
in a log or an error (docs/ARCHITECTURE.md, "Annotation queues", step 3): a period's tasks are
in SQL, committed, before Redis offers any of them, so a label never finds its task missing;
a database error is reported by its type, never with its message (which carries the rows)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, select

from service.db.models import AnnotationTask
from service.queues import service as qservice
from tests.conftest import Api
from tests.queues.test_queues import HOUR_MS, Clock, MaskSpy, lease_all, make_queue, submit


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(qservice, "_now_ms", c)
    return c


@pytest.fixture
def keep_all(monkeypatch: pytest.MonkeyPatch) -> MaskSpy:
    s = MaskSpy(force=True)
    monkeypatch.setattr(qservice, "bernoulli_mask", s)
    return s


async def rows_of(api: Api, q: str) -> list[AnnotationTask]:
    rt = await qservice.runtime(ctx=api.ctx, name=q)
    async with api.ctx.sessionmaker() as session:
        stmt = select(AnnotationTask).where(AnnotationTask.queue_id == rt.id)
        return list((await session.execute(stmt)).scalars().all())


@contextmanager
def database_refuses(api: Api, statement: str) -> Iterator[list[int]]:
    """Every statement starting with ``statement`` fails as a locked SQLite database does;
    yields the list its failures are counted in."""
    engine = api.ctx.engine.sync_engine
    failed: list[int] = []
    error = api.ctx.engine.dialect.loaded_dbapi.OperationalError

    def refuse(conn: Any, cursor: Any, stmt: str, params: Any, context: Any, many: bool) -> None:
        if stmt.lstrip().upper().startswith(statement):
            failed.append(1)
            raise error("database is locked")

    event.listen(engine, "before_cursor_execute", refuse)
    try:
        yield failed
    finally:
        event.remove(engine, "before_cursor_execute", refuse)


async def test_labelling_a_task_as_its_release_is_written_neither_fails_nor_duplicates(
    qapi: Api,
    keep_all: MaskSpy,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    canary = "CANARY-LOGCITY-" + secrets.token_hex(4)
    q = await make_queue(qapi, beta=0.5, k=1)
    await submit(qapi, q, [f"{canary} one", f"{canary} two"])
    store = qapi.ctx.stores.queues
    real_release = store.release
    answers: list[Any] = []

    async def release_then_label(**kw: Any) -> list[str]:
        # the moment the tasks are in Redis, before the release goes on: annotators take and
        # label them (on the code before, their SQL rows were written after this point)
        out = await real_release(**kw)
        for t in await lease_all(qapi, q):
            r = await qapi.post(
                f"/v1/queues/{q}/tasks/{t['id']}/label", "ann1", json={"label": "1"}
            )
            answers.append((r.status_code, t["text"], t["uncertainty"]))
        return out

    monkeypatch.setattr(store, "release", release_then_label)
    clock.ms += HOUR_MS
    done = await qservice.release_due(qapi.ctx)
    assert done["failed"] == 0 and done["released"] >= 2
    assert sorted((a[0], a[1]) for a in answers) == [
        (200, f"{canary.lower()} one"),
        (200, f"{canary.lower()} two"),
    ]
    rows = await rows_of(qapi, q)
    assert len(rows) == 2  # one row per released key, written by the release itself
    assert all(r.label == "1" and not r.key_hash.startswith("unknown:") for r in rows)
    assert sorted(r.uncertainty for r in rows) == sorted(a[2] for a in answers)
    assert canary.lower() not in caplog.text and canary not in caplog.text


async def test_a_release_the_database_refuses_logs_no_payload_and_offers_nothing(
    qapi: Api, keep_all: MaskSpy, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    canary = "CANARY-LOGCITY-" + secrets.token_hex(4)
    q = await make_queue(qapi, beta=0.5, k=1)
    await submit(qapi, q, [f"{canary} record"])
    clock.ms += HOUR_MS
    with database_refuses(qapi, "INSERT INTO ANNOTATION_TASK") as failed:
        done = await qservice.release_due(qapi.ctx)
    assert failed and done["failed"] == 1
    assert canary.lower() not in caplog.text and "Traceback" not in caplog.text
    assert f"releasing queue {q} failed: Unavailable" in caplog.text
    # nothing was offered: the period is released by the next run, whole
    assert await lease_all(qapi, q) == []
    done = await qservice.release_due(qapi.ctx)
    assert done["failed"] == 0
    (t,) = await lease_all(qapi, q)
    assert t["text"] == f"{canary.lower()} record"
    # a label the database refuses: a 503 naming no value, and the labeller's retry completes
    url = f"/v1/queues/{q}/tasks/{t['id']}/label"
    with database_refuses(qapi, "UPDATE ANNOTATION_TASK"):
        r = await qapi.post(url, "ann1", json={"label": "1"})
    assert r.status_code == 503 and canary.lower() not in r.text
    assert "the database refused the write (OperationalError)" in r.json()["detail"]
    r = await qapi.post(url, "ann1", json={"label": "1"})
    assert r.status_code == 200 and r.json()["replayed"] is True
    (row,) = await rows_of(qapi, q)
    assert row.label == "1"
    assert canary.lower() not in caplog.text
