"""Issue 13 item 17: the bootstrap admin key file is written (atomically) before the admin row
is committed, so a failed write leaves no admin nobody holds the key of; a re-run with an admin
row but no key file says how to recover."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.admin.service import RECOVERY, bootstrap_admin
from service.config import Settings
from service.db.migrate import upgrade
from service.db.models import ApiKey
from service.db.session import make_engine, make_sessionmaker, sync_url
from tests.serving import cli, cli_env


@pytest.fixture
async def fresh(tmp_path: Path) -> AsyncIterator[tuple[Settings, async_sessionmaker[AsyncSession]]]:
    """A new SQLite database of its own (bootstrap acts only when no admin exists)."""
    settings = Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'b.db'}")
    upgrade(settings.resolved_database_url)
    engine = make_engine(settings.resolved_database_url)
    try:
        yield settings, make_sessionmaker(engine)
    finally:
        await engine.dispose()


async def _admins(sm: async_sessionmaker[AsyncSession]) -> int:
    async with sm() as s:
        return int(await s.scalar(select(func.count()).select_from(ApiKey)) or 0)


async def test_a_failed_key_write_commits_no_admin_and_a_rerun_writes_the_key(
    fresh: tuple[Settings, async_sessionmaker[AsyncSession]],
) -> None:
    settings, sm = fresh
    key_path = settings.data_dir / "admin.key"
    key_path.mkdir(parents=True)  # a directory where the key file goes: the write fails
    with pytest.raises(OSError):
        await bootstrap_admin(sessionmaker=sm, settings=settings)
    assert await _admins(sm) == 0  # no admin row whose key nobody has
    assert [p.name for p in settings.data_dir.iterdir()] == ["admin.key"]  # no temp file left
    key_path.rmdir()
    path = await bootstrap_admin(sessionmaker=sm, settings=settings)
    assert path == str(key_path) and await _admins(sm) == 1
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    key = key_path.read_text().strip()
    async with sm() as s:
        row = await s.scalar(select(ApiKey))
    assert row is not None and key.startswith(f"sk_{row.id}_")


async def test_a_rerun_without_the_key_file_says_how_to_recover(
    fresh: tuple[Settings, async_sessionmaker[AsyncSession]], caplog: pytest.LogCaptureFixture
) -> None:
    settings, sm = fresh
    path = await bootstrap_admin(sessionmaker=sm, settings=settings)
    assert path is not None
    with caplog.at_level(logging.WARNING, logger="selectivity.admin"):
        assert await bootstrap_admin(sessionmaker=sm, settings=settings) is None
    assert not caplog.records  # the key file is there: nothing to say
    Path(path).unlink()
    with caplog.at_level(logging.WARNING, logger="selectivity.admin"):
        assert await bootstrap_admin(sessionmaker=sm, settings=settings) is None
    assert "selectivity admin create-key --role admin" in caplog.text
    assert "sk_" not in caplog.text
    assert await _admins(sm) == 1 and not Path(path).exists()


@pytest.mark.slow
def test_migrate_fails_when_the_key_cannot_be_written_and_recovers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = cli_env(DATA_DIR=str(data), DATABASE_URL=f"sqlite:///{tmp_path / 'm.db'}")
    (data / "admin.key").mkdir(parents=True)
    p = cli("migrate", env=env)
    assert p.returncode != 0
    assert "bootstrap admin key written" not in p.stdout
    (data / "admin.key").rmdir()
    p = cli("migrate", env=env)
    assert p.returncode == 0, p.stderr
    assert "bootstrap admin key written" in p.stdout
    key = (data / "admin.key").read_text().strip()
    assert key.startswith("sk_")
    (data / "admin.key").unlink()
    p = cli("migrate", env=env)
    assert p.returncode == 0 and "bootstrap admin key written" not in p.stdout
    assert RECOVERY.split("`")[1] in p.stderr  # the command that mints a new admin key
    p = cli("admin", "create-key", "--role", "admin", env=env)
    assert p.returncode == 0 and p.stdout.strip().startswith("sk_")


async def test_a_failed_commit_removes_the_key_file(
    fresh: tuple[Settings, async_sessionmaker[AsyncSession]],
) -> None:
    """A commit that fails after the key file was written (here: a deferred foreign key that
    SQLite checks only at COMMIT, violated by a trigger on the new admin row) leaves no file."""
    settings, sm = fresh
    engine = create_engine(sync_url(settings.resolved_database_url))
    with engine.begin() as c:
        c.execute(text("CREATE TABLE boom_parent (id INTEGER PRIMARY KEY)"))
        c.execute(
            text(
                "CREATE TABLE boom (x INTEGER REFERENCES boom_parent(id) "
                "DEFERRABLE INITIALLY DEFERRED)"
            )
        )
        c.execute(
            text(
                "CREATE TRIGGER boom_on_key AFTER INSERT ON api_key "
                "BEGIN INSERT INTO boom VALUES (1); END"
            )
        )
    engine.dispose()
    with pytest.raises(IntegrityError):
        await bootstrap_admin(sessionmaker=sm, settings=settings)
    assert await _admins(sm) == 0
    assert not (settings.data_dir / "admin.key").exists()
    assert not list(settings.data_dir.iterdir())  # no temp file either
