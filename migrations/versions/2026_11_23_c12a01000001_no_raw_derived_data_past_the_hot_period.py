"""no raw-data-derived data past the hot period (issue 12, items 1 and 2)

Drops ``stream_window.observations`` (the exact count of a window: ``GET /windows`` now counts
hot windows live and shows null for the others) and deletes the reference models of epochs
before each stream's current one (a model holds raw values; it lives during its epoch only).
On SQLite, ``secure_delete`` zeroes what is deleted here.

Revision ID: c12a01000001
Revises: 7f3c1a9e2b10
Create Date: 2026-11-23 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "c12a01000001"
down_revision = "7f3c1a9e2b10"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA secure_delete=ON")
    op.execute(
        "DELETE FROM reference_model WHERE epoch < "
        "(SELECT stream.epoch FROM stream WHERE stream.id = reference_model.stream_id)"
    )
    with op.batch_alter_table("stream_window", schema=None) as batch_op:
        batch_op.drop_column("observations")


def downgrade() -> None:
    with op.batch_alter_table("stream_window", schema=None) as batch_op:
        batch_op.add_column(sa.Column("observations", sa.Integer(), nullable=True))
