"""Migrations run on SQLite and (in CI) PostgreSQL: up, down to base, up again, and the
result matches the models."""

from __future__ import annotations

import secrets
from contextlib import ExitStack
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from service.db.migrate import downgrade, upgrade
from service.db.models import Base
from service.db.session import sync_url
from tests.conftest import DATABASE_URL, Backend, pg_schema


def test_upgrade_downgrade_upgrade_matches_models(backend: Backend, tmp_path: Path) -> None:
    with ExitStack() as stack:
        if backend.name == "servers" and DATABASE_URL:
            url = stack.enter_context(pg_schema(f"seltest_mig_{secrets.token_hex(4)}"))
        else:
            url = f"sqlite:///{tmp_path / 'm.db'}"
        engine = create_engine(sync_url(url))
        stack.callback(engine.dispose)
        upgrade(url)
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        downgrade(url, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(url)
        assert {"stream", "stream_window", "api_key", "count_table"} <= set(
            inspect(engine).get_table_names()
        )
