"""Migrations run on SQLite and (in CI) PostgreSQL: up, down to base, up again, and the
result matches the models."""

from __future__ import annotations

import secrets
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from service.db.migrate import downgrade, upgrade
from service.db.models import Base
from service.db.session import sync_url
from tests.conftest import DATABASE_URL, Backend, _pg_schema_url


def test_upgrade_downgrade_upgrade_matches_models(backend: Backend, tmp_path: Path) -> None:
    schema = None
    if backend.name == "servers" and DATABASE_URL:
        schema = f"seltest_mig_{secrets.token_hex(4)}"
        admin = create_engine(sync_url(DATABASE_URL))
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        url = _pg_schema_url(DATABASE_URL, schema)
    else:
        url = f"sqlite:///{tmp_path / 'm.db'}"
    engine = create_engine(sync_url(url))
    try:
        upgrade(url)
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        downgrade(url, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(url)
        assert {"stream", "stream_window", "api_key", "count_table"} <= set(
            inspect(engine).get_table_names()
        )
    finally:
        engine.dispose()
        if schema:
            with admin.begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
            admin.dispose()
