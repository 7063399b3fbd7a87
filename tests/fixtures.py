"""The factories every test shares (imported from ``tests.conftest`` as well): the backends
(``backend``: the embedded defaults always, the servers of SELECTIVITY_TEST_REDIS_URL /
SELECTIVITY_TEST_DATABASE_URL when set), ``app_context`` (an AppContext on some settings),
``fresh_context`` and ``own_database`` (a database of its own), ``in_process_api`` (the app
served in this process with a key per role: the ``api`` fixture), ``pg_schema`` (a
throw-away PostgreSQL schema) and the ``ctx``, ``jobs``, ``api`` and ``default_app``
fixtures. A pytest plugin: ``tests/conftest.py`` loads it in every process that runs tests."""

from __future__ import annotations

import asyncio
import copy
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import redis
from fastapi import FastAPI
from sqlalchemy import create_engine, text
from starlette.datastructures import State

from service import resources
from service.admin import service as keys_service
from service.app import create_app
from service.coldstore import service as coldstore
from service.config import Settings
from service.context import AppContext
from service.db.migrate import upgrade
from service.db.session import sync_url
from service.lifecycle import followups
from tests.conftest import BACKENDS, DATABASE_URL, REDIS_URL, ROLES


@dataclass
class Backend:
    name: str
    settings: Settings
    embedded: resources.EmbeddedRedis | None
    # the shares of the backend's first cold-store key, held only in this process's memory
    cold_shares: list[str]


def make_cold_key(settings: Settings, embedded: resources.EmbeddedRedis | None) -> list[str]:
    """The test-only way to a cold-store key (ingest refuses batches without one): made here
    by ``init_key``, its shares returned to the caller and kept in memory, never in a file."""

    async def main() -> list[str]:
        async with app_context(settings, embedded) as c:
            _, shares = await coldstore.init_key(
                sessionmaker=c.sessionmaker, shares=3, threshold=2, actor="test"
            )
        return shares

    return asyncio.run(main())


def _pg_schema_url(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


@contextmanager
def pg_schema(schema: str) -> Iterator[str]:
    """A fresh schema on SELECTIVITY_TEST_DATABASE_URL, dropped at the end: the URL that
    works in it."""
    assert DATABASE_URL
    admin = create_engine(sync_url(DATABASE_URL))
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        try:
            yield _pg_schema_url(DATABASE_URL, schema)
        finally:
            with admin.begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()


@pytest.fixture(scope="session", params=BACKENDS)
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backend]:
    name = request.param
    data_dir = tmp_path_factory.mktemp(f"data-{name}")
    run = secrets.token_hex(4)
    prefix = f"seltest{run}"
    with ExitStack() as stack:
        database_url = None
        if name == "servers" and DATABASE_URL:
            database_url = stack.enter_context(pg_schema(f"seltest_{run}"))
        settings = Settings(
            data_dir=data_dir,
            redis_url=REDIS_URL if name == "servers" else None,
            database_url=database_url,
            redis_prefix=prefix,
            embedded_worker=False,
            max_batch=2000,
            max_body_bytes=4 * 1024 * 1024,
        )
        embedded = None if settings.redis_url else resources.EmbeddedRedis(settings)
        upgrade(settings.resolved_database_url)
        yield Backend(name, settings, embedded, make_cold_key(settings, embedded))
        if embedded is not None:
            embedded.close()
        else:
            r = redis.Redis.from_url(REDIS_URL)  # type: ignore[arg-type]
            for k in r.scan_iter(match=f"{prefix}:*", count=1000):
                r.delete(k)
            for k in r.scan_iter(match=f"saq:{prefix}*", count=1000):
                r.delete(k)
            r.close()


@contextmanager
def own_database(backend: Backend, data_dir: Path) -> Iterator[Backend]:
    """``backend`` on a database of its own (SQLite in ``data_dir``, or a fresh PostgreSQL
    schema on the servers backend), migrated, with a cold-store key; the same Redis and key
    prefix. For tests of what goes through every stream (a metrics refresh, ``count_all``,
    the scheduler's tick): on the session's database that work grows with every stream the
    earlier tests of the process made."""
    with ExitStack() as stack:
        database_url = None
        if backend.settings.database_url:
            database_url = stack.enter_context(pg_schema(f"seltest_{secrets.token_hex(4)}"))
        settings = Settings(
            **{**backend.settings.model_dump(), "data_dir": data_dir, "database_url": database_url}
        )
        upgrade(settings.resolved_database_url)
        cold_shares = make_cold_key(settings, backend.embedded)
        yield Backend(backend.name, settings, backend.embedded, cold_shares)


@asynccontextmanager
async def app_context(
    settings: Settings, embedded: resources.EmbeddedRedis | None = None
) -> AsyncIterator[AppContext]:
    """The service's resources on ``settings`` (as ``selectivity serve`` builds them), closed
    at the end."""
    c = await resources.build(settings, embedded=embedded)
    try:
        yield c
    finally:
        await resources.close(c)


@asynccontextmanager
async def fresh_context(
    backend: Backend, data_dir: Path, **over: object
) -> AsyncIterator[AppContext]:
    """A first start: an AppContext on a database of its own (no cold-store key, no streams,
    no admin; a fresh PostgreSQL schema on the servers backend) with its own data dir, on the
    backend's Redis and key prefix (stream names are unique per test). ``over``: more
    settings."""
    with ExitStack() as stack:
        database_url = None
        if backend.settings.database_url:
            database_url = stack.enter_context(pg_schema(f"seltest_{secrets.token_hex(4)}"))
        settings = Settings(
            data_dir=data_dir,
            redis_url=backend.settings.redis_url,
            database_url=database_url,
            redis_prefix=backend.settings.redis_prefix,
            embedded_worker=False,
            **over,  # type: ignore[arg-type]
        )
        resources.secure_data_dir(settings)  # as `selectivity serve` does first
        upgrade(settings.resolved_database_url)
        async with app_context(settings, backend.embedded) as c:
            yield c


@pytest.fixture
async def ctx(backend: Backend) -> AsyncIterator[AppContext]:
    async with app_context(backend.settings, backend.embedded) as c:
        yield c


class Jobs:
    """The worker's part, run here and now: ``await jobs()`` runs every unfinished follow-up
    of the rolls so far (selection rounds, reference models, webhooks, next windows), in
    order, as the worker's keyed jobs would, instead of polling for a worker; returns how
    many ran. Only this test's: those left unfinished by earlier tests of the session (their
    streams share the backend) are not run again and again."""

    def __init__(self, ctx: AppContext, earlier: set[tuple[str, str, int]]) -> None:
        self.ctx = ctx
        self.earlier = earlier

    async def __call__(self) -> int:
        ran = 0
        for kind, name, epoch in await followups.pending(self.ctx):
            if (kind, name, epoch) not in self.earlier:
                await followups.run(self.ctx, kind=kind, name=name, epoch=epoch)
                ran += 1
        return ran


@pytest.fixture
async def jobs(ctx: AppContext) -> Jobs:
    return Jobs(ctx, set(await followups.pending(ctx)))


@dataclass
class Api:
    client: httpx.AsyncClient
    keys: dict[str, str]
    ctx: AppContext

    def auth(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[role]}"}

    async def post(self, url: str, role: str = "admin", **kw: object) -> httpx.Response:
        return await self.client.post(
            url,
            headers={**self.auth(role), **kw.pop("headers", {})},  # type: ignore[dict-item]
            **kw,
        )  # type: ignore[arg-type]

    async def get(self, url: str, role: str = "admin", **kw: object) -> httpx.Response:
        return await self.client.get(url, headers=self.auth(role), **kw)  # type: ignore[arg-type]

    async def add_keys(self, **roles: str) -> list[str]:
        """New API keys, ``name=role`` each (one transaction), kept in ``keys`` under their
        names for ``post``/``get``; returns them in order."""
        async with self.ctx.sessionmaker() as session, session.begin():
            for name, role in roles.items():
                self.keys[name] = (await keys_service.create(session=session, role=role)).key
        return [self.keys[name] for name in roles]


@pytest.fixture(scope="session")
def default_app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    """``create_app`` on the default settings (in a data dir of its own), built once per
    process for the tests that read its routes or its OpenAPI document (built on first use,
    a third of a second of CPU, then cached on the app); none changes either."""
    return create_app(Settings(data_dir=tmp_path_factory.mktemp("default-app")))


_APPS: dict[str, FastAPI] = {}


def app_on(ctx: AppContext) -> FastAPI:
    """``create_app(ctx=ctx)``, as a copy of an app built once per process and settings: FastAPI
    prepares every route of a router on the first request to it (about 20 ms of CPU a router),
    which a fresh app paid again in every test. The copy has a state of its own (``request.app``
    is the copy: this ``ctx``, its own gates); it shares the routes, and the middleware and
    handlers, which read the settings the app was built with (the key here)."""
    key = ctx.settings.model_dump_json()
    base = _APPS.get(key)
    if base is None:
        base = _APPS[key] = create_app(ctx=ctx)
        base.middleware_stack = base.build_middleware_stack()
    app = copy.copy(base)
    app.state = State()
    app.state.ctx = ctx
    return app


@asynccontextmanager
async def in_process_api(ctx: AppContext, roles: tuple[str, ...] = ROLES) -> AsyncIterator[Api]:
    """The app on ``ctx`` (``app_on``) served in this process (httpx over ASGI, no socket, no
    worker), with a fresh key for each of ``roles``: the one in-process test server."""
    transport = httpx.ASGITransport(app=app_on(ctx))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        api = Api(client, {}, ctx)
        await api.add_keys(**{role: role for role in roles})
        yield api


@pytest.fixture
async def api(ctx: AppContext) -> AsyncIterator[Api]:
    async with in_process_api(ctx) as a:
        yield a
