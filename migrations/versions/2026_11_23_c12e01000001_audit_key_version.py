"""audit log: keyed entries (issue 12, item 13)

Entries written before this revision keep ``key_version`` 0 (plain SHA-256 chain) and still
verify; the service writes every new entry with ``key_version`` 1 (HMAC-SHA256 under a key
the database does not hold) and anchors the switch outside the database
(docs/ARCHITECTURE.md, "Audit log").

Revision ID: c12e01000001
Revises: c12a01000001
Create Date: 2026-11-23 12:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "c12e01000001"
down_revision = "c12a01000001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audit_log") as batch:
        batch.add_column(sa.Column("key_version", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("audit_log") as batch:
        batch.drop_column("key_version")
