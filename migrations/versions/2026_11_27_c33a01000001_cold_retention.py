"""windows: when the cold store deleted their segments

A stream may keep its windows' raw rows in the cold store for a bounded number of windows
(``cold_retention_windows``); the seal job then deletes a window's segment files and index rows
and records when on the window. Every window before this revision keeps its segments.

Revision ID: c33a01000001
Revises: c32a01000001
Create Date: 2026-11-27 20:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "c33a01000001"
down_revision = "c32a01000001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("stream_window") as batch:
        batch.add_column(sa.Column("cold_deleted_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("stream_window") as batch:
        batch.drop_column("cold_deleted_at")
