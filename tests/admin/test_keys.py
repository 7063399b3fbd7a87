from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import select

from service.admin.service import bootstrap_admin
from service.config import Settings
from service.db.models import ApiKey
from tests.conftest import Api
from tests.serving import cli, cli_env


async def test_keys_are_hashed_at_rest_and_shown_once(api: Api) -> None:
    r = await api.post("/v1/admin/keys", json={"role": "producer", "name": "etl"})
    assert r.status_code == 201
    created = r.json()
    key = created["key"]
    async with api.ctx.sessionmaker() as session:
        rows = (await session.execute(select(ApiKey))).scalars().all()
    assert all(key.encode() not in row.key_hash and key != row.name for row in rows)
    row = next(r for r in rows if r.id == created["id"])
    assert len(row.key_hash) == 32  # SHA-256 only
    # the new key works with its role
    h = {"Authorization": f"Bearer {key}"}
    assert (await api.client.get("/v1/streams", headers=h)).status_code == 200
    assert (
        await api.client.post("/v1/admin/keys", headers=h, json={"role": "admin"})
    ).status_code == 403
    # a key with one changed character does not
    bad = key[:-1] + ("A" if key[-1] != "A" else "B")
    assert (
        await api.client.get("/v1/streams", headers={"Authorization": f"Bearer {bad}"})
    ).status_code == 401
    r = await api.post("/v1/admin/keys", json={"role": "wizard"})
    assert r.status_code == 422 and "role" in r.json()["detail"]


async def test_bootstrap_admin_key_file_is_private(api: Api, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from service.db.migrate import upgrade

    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'b.db'}")
    upgrade(settings.resolved_database_url)
    from service.db.session import make_engine, make_sessionmaker

    engine = make_engine(settings.resolved_database_url)
    sm = make_sessionmaker(engine)
    try:
        path = await bootstrap_admin(sessionmaker=sm, settings=settings)
        assert path is not None
        mode = stat.S_IMODE(os.stat(path).st_mode)
        assert mode == 0o600
        key = Path(path).read_text().strip()
        assert key.startswith("sk_")
        assert await bootstrap_admin(sessionmaker=sm, settings=settings) is None
    finally:
        await engine.dispose()


@pytest.mark.slow
def test_cli_create_key(tmp_path: Path) -> None:
    env = cli_env(DATA_DIR=str(tmp_path), DATABASE_URL=f"sqlite:///{tmp_path / 'c.db'}")
    cli("migrate", env=env).check_returncode()
    out = cli("admin", "create-key", "--role", "model", env=env)
    out.check_returncode()
    assert out.stdout.strip().startswith("sk_")
    bad = cli("admin", "create-key", "--role", "wizard", env=env)
    assert bad.returncode != 0 and "wizard" in bad.stderr
