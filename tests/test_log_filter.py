"""No row value in a log record (``service.core.logsafe``; docs/ARCHITECTURE.md, "Threat model
and promises", promise 1): a canary pushed through every error path the tests can force, a
database error carrying it in its SQL parameters, an exception raised in a request, bad header
values, an unlock justification, a failing worker job, and a real ``selectivity serve``'s own
exception logging, is in no log record's formatted output (message, exception, stack), no
response body, no audit entry and no job record."""

from __future__ import annotations

import asyncio
import logging
import secrets
import sqlite3
import sys
import traceback
from collections.abc import Iterable

import httpx
import pytest
from saq.job import Status
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

import tests.serving as serving
from service.app import create_app
from service.core import logsafe
from service.streams import service as streams_service
from tests.conftest import Api, Backend
from tests.helpers import cancel_and_wait, new_stream, obs, redis_dump, sql_dump
from workers import jobs as worker_jobs
from workers import runner


def canary() -> str:
    return f"CANARY-7f3a-{secrets.token_hex(4)}"


def rendered(record: logging.LogRecord) -> str:
    """Everything a handler could print of ``record``: its message, its exception (formatted
    from ``exc_info`` as any formatter would, and its cached text), its stack."""
    parts = [record.getMessage(), logging.Formatter().format(record)]
    if record.exc_info:
        parts.append("".join(traceback.format_exception(*record.exc_info)))
    parts += [record.exc_text or "", record.stack_info or ""]
    return "\n".join(parts)


def assert_absent(value: str, records: Iterable[logging.LogRecord]) -> None:
    for record in records:
        assert value not in rendered(record), (record.name, rendered(record))


# -- the filter itself --------------------------------------------------------------------


def _raise_chained(value: str) -> None:
    try:
        raise KeyError(value)
    except KeyError as exc:
        raise ValueError(f"bad row {value}") from exc


def test_an_exception_is_rendered_as_types_and_frames_without_messages() -> None:
    value = canary()
    try:
        _raise_chained(value)
    except ValueError as exc:
        out = logsafe.format_exception(exc)
    assert value not in out
    assert "KeyError" in out and "ValueError" in out and "_raise_chained" in out
    assert "direct cause" in out
    # what no message may hide: the type, the frames; a known SQLite message is kept
    locked = sqlite3.OperationalError("database is locked")
    assert logsafe.describe(locked) == "sqlite3.OperationalError: database is locked"
    gone = FileNotFoundError(2, "No such file or directory", f"/data/{value}")
    assert logsafe.describe(gone) == "FileNotFoundError: [Errno 2] No such file or directory"
    group = ExceptionGroup("two", [RuntimeError(value), TypeError(value)])
    out = logsafe.format_exception(group)
    assert value not in out and "RuntimeError" in out and "TypeError" in out


def test_every_record_is_sanitized_whichever_logger_and_handler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logsafe.install()
    caplog.set_level(logging.DEBUG)
    value = canary()
    ours, foreign = logging.getLogger("selectivity.test"), logging.getLogger("somelib")
    try:
        _raise_chained(value)
    except ValueError as exc:
        ours.exception("release failed")
        foreign.exception("job %s failed", "j1")
        ours.error("failed: %s", exc)
        foreign.error("failed: %(e)s", {"e": exc})
        foreign.error(exc)
    foreign.error("Task exception was never retrieved\nfuture: <Task exception=" + value + ">")
    foreign.warning("object %s, %s", [value], object())
    assert len(caplog.records) == 7
    assert_absent(value, caplog.records)
    assert "ValueError" in caplog.text and "_raise_chained" in caplog.text
    assert "Task exception was never retrieved" in caplog.text


# -- SQL parameters -----------------------------------------------------------------------


async def test_a_database_error_shows_no_parameter(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """Two errors with the canary among the statement's parameters: a UNIQUE violation (the
    message names the statement, never its parameters: ``hide_parameters``) and a NOT NULL
    violation, whose message on PostgreSQL carries the failing row itself (``DETAIL: Failing
    row contains (…)``), which no engine setting hides: there only the log filter, which never
    renders an exception's message, keeps it out of the logs."""
    caplog.set_level(logging.DEBUG)
    value = canary()
    async with api.ctx.sessionmaker() as s:
        taken = await s.scalar(text("SELECT id FROM api_key LIMIT 1"))
        with pytest.raises(IntegrityError) as unique:
            await s.execute(  # an id taken: a UNIQUE violation, the canary a parameter
                text(
                    "INSERT INTO api_key (id, name, role, key_hash, actor, created_at) "
                    "VALUES (:i, :v, 'admin', :h, :a, CURRENT_TIMESTAMP)"
                ),
                {"i": taken, "v": value, "h": b"0" * 32, "a": "test"},
            )
        await s.rollback()
        with pytest.raises(IntegrityError) as not_null:
            await s.execute(  # no key hash: NOT NULL, the canary in the failing row
                text(
                    "INSERT INTO api_key (id, name, role, actor, created_at) "
                    "VALUES ('nn-canary', :v, 'admin', 'test', CURRENT_TIMESTAMP)"
                ),
                {"v": value},
            )
        await s.rollback()
    assert value not in str(unique.value)  # hide_parameters on the engine
    assert value not in "".join(traceback.format_exception(unique.value))
    if api.ctx.engine.dialect.name == "postgresql":  # why the filter is needed at all
        assert value in str(not_null.value)
    for raised in (unique, not_null):
        logging.getLogger("selectivity.test").error("insert failed", exc_info=raised.value)
        logging.getLogger("selectivity.test").error("insert failed: %s", raised.value)
    assert "IntegrityError" in caplog.text
    assert_absent(value, caplog.records)


# -- the HTTP paths -----------------------------------------------------------------------


async def test_a_500_answers_a_generic_body_and_logs_no_value(
    api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    value = canary()

    async def broken(**_: object) -> None:
        raise RuntimeError(f"could not list: {value}")

    monkeypatch.setattr(streams_service, "list_out", broken)
    transport = httpx.ASGITransport(app=create_app(ctx=api.ctx), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        r = await client.get("/v1/streams", headers=api.auth("admin"))
    assert r.status_code == 500
    assert r.json()["error"] == "InternalError" and value not in r.text
    rid = r.json()["detail"].split("request ")[1].split(")")[0]
    assert any(f"RuntimeError, request {rid}" in rec.getMessage() for rec in caplog.records)
    assert_absent(value, caplog.records)


async def test_bad_header_values_are_neither_echoed_nor_logged(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    value = canary()
    name = await new_stream(api, "loghdr")
    url = f"/v1/streams/{name}/observations"
    body = {"observations": [obs("u1", "i1", 20, "1")]}
    answers = [
        await api.post(url, "producer", content=b"{}", headers={"Content-Type": f"x/{value}"}),
        await api.client.post(url, json=body, headers={"Authorization": f"Bearer {value}"}),
        await api.client.post(url, json=body, headers={"Authorization": f"sk_{value}_x"}),
        await api.post(url, "producer", json=body, headers={"Idempotency-Key": value * 20}),
        await api.client.get(
            f"/v1/streams/{name}/events?follow_seconds=0",
            headers={**api.auth("model"), "Last-Event-ID": value},
        ),
    ]
    assert [a.status_code for a in answers] == [415, 401, 401, 422, 422]
    for a in answers:
        assert value not in a.text
    assert_absent(value, caplog.records)


async def test_an_unlock_justification_is_kept_with_its_request_only(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    value = canary()
    name = await new_stream(api, "logunl")
    why = f"complaint about the row {value}"
    r = await api.post(
        "/v1/admin/unlock-requests",
        "analyst",
        json={"stream": name, "from_window": 1, "to_window": 1, "justification": why},
    )
    assert r.status_code == 201, r.text
    entries = (await api.get("/v1/admin/audit?limit=1000")).json()["entries"]
    mine = [e for e in entries if e["action"] == "unlock.request" and e["detail"]["stream"] == name]
    assert len(mine) == 1 and mine[0]["detail"]["justification_chars"] == len(why)
    assert value not in str(entries)
    async with api.ctx.sessionmaker() as s:
        stored = await s.scalar(
            text("SELECT count(*) FROM audit_log WHERE CAST(detail AS TEXT) LIKE :v"),
            {"v": f"%{value}%"},
        )
    assert stored == 0
    assert_absent(value, caplog.records)


# -- a failing job ------------------------------------------------------------------------


async def test_a_failing_job_records_and_logs_no_value(
    api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    value = canary()
    ctx = api.ctx
    queue = f"{{{ctx.keys.prefix}:logjobs-{secrets.token_hex(3)}}}"
    monkeypatch.setattr(runner, "queue_name", lambda _keys, _klass="service": queue)

    async def broken(_ctx: object, stream: str, part: int = 0) -> int:
        async with ctx.sessionmaker() as s:  # a driver error with the canary as a parameter
            await s.execute(text("SELECT * FROM no_such_table WHERE x = :v"), {"v": value})
        return 0

    monkeypatch.setattr(worker_jobs.counting, "count_stream", broken)
    worker = runner.make_worker(ctx)
    worker.cron_jobs = []  # only the job below
    worker.SIGNALS = []
    job = await worker.queue.enqueue("count_stream", stream="logjob", retries=1, key="boom")
    assert job is not None
    task = asyncio.create_task(worker.start())
    try:
        for _ in range(600):
            await job.refresh()
            if job.status in (Status.FAILED, Status.COMPLETE):
                break
            await asyncio.sleep(0.05)
    finally:
        await cancel_and_wait(task)
        await worker.stop()
    assert job.status == Status.FAILED
    assert job.error is not None and "JobFailed" in job.error
    # type and frames (SQLite: OperationalError; PostgreSQL: ProgrammingError)
    assert "sqlalchemy.exc." in job.error and "in broken" in job.error
    assert value not in job.error
    assert "Error processing job" in caplog.text
    assert_absent(value, caplog.records)
    assert value.encode() not in await redis_dump(ctx)
    assert value.encode() not in await sql_dump(ctx)


# -- uvicorn's own logging in a real server ------------------------------------------------

# ``selectivity serve`` with one change: a request whose Authorization header holds
# "CANARY" fails inside the app, with a driver error whose SQL parameter is the header, or
# with an exception whose message is the header.
SERVE = r"""
import sys
from sqlalchemy import text
import service.api.deps as deps

authenticate = deps.authenticate

async def failing(*, ctx, authorization):
    if authorization and "CANARY" in authorization:
        if "db" in authorization:
            async with ctx.sessionmaker() as s:
                await s.execute(text("SELECT * FROM no_such_table WHERE x = :v"),
                                {"v": authorization})
        raise RuntimeError("refused " + authorization)
    return await authenticate(ctx=ctx, authorization=authorization)

deps.authenticate = failing
from service.cli.entry import main
main(sys.argv[1:])
"""


@pytest.mark.slow  # a real server in a subprocess
def test_a_real_server_logs_no_value_on_its_500s(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, backend: Backend
) -> None:
    value = canary()
    monkeypatch.setattr(serving, "CLI", [sys.executable, "-c", SERVE])
    with serving.serving(tmp_path, EMBEDDED_WORKER="0") as server:  # type: ignore[arg-type]
        bodies = []
        for auth in (f"Bearer {value}", f"Bearer db-{value}"):
            r = httpx.get(f"{server.base}/v1/streams", headers={"Authorization": auth})
            assert r.status_code == 500
            bodies.append(r.text)
        r = httpx.post(
            f"{server.base}/v1/streams",
            content=b"{}",
            headers={"Content-Type": f"text/{value}", "Authorization": "Bearer sk_x_y"},
        )
        assert r.status_code in (401, 415)
        bodies.append(r.text)
        server.stop()
    log = server.log
    assert "Exception in ASGI application" in log
    assert "RuntimeError" in log and "OperationalError" in log and "failing" in log
    assert value not in log
    for body in bodies:
        assert value not in body
