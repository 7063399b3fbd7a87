"""api keys: the actor who holds each; streams: a state, ``creating`` until ready

``api_key.actor`` names who holds a key (a person or a system, given at creation): break glass
refuses approvals by the requester's actor and counts one approval per actor. A key made before
this revision belongs to an actor of its own, its id. ``stream.state`` is ``creating`` while a
new stream's first windows are prepared in Redis outside the SQL transaction, then ``ready``;
every stream that exists before this revision is ready.

Revision ID: c27g01000001
Revises: c26a01000001
Create Date: 2026-11-25 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "c27g01000001"
down_revision = "c26a01000001"
branch_labels = None
depends_on = None

api_key = sa.table("api_key", sa.column("id", sa.String), sa.column("actor", sa.String))


def upgrade() -> None:
    with op.batch_alter_table("api_key") as batch:
        batch.add_column(sa.Column("actor", sa.String(200), nullable=True))
    op.execute(api_key.update().values(actor=api_key.c.id))
    with op.batch_alter_table("api_key") as batch:
        batch.alter_column("actor", existing_type=sa.String(200), nullable=False)
    with op.batch_alter_table("stream") as batch:
        batch.add_column(sa.Column("state", sa.String(16), nullable=False, server_default="ready"))


def downgrade() -> None:
    with op.batch_alter_table("stream") as batch:
        batch.drop_column("state")
    with op.batch_alter_table("api_key") as batch:
        batch.drop_column("actor")
